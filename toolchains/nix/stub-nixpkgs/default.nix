{ system ? "x86_64-linux", ... }:
let
  # Placeholders build with the host shell and tools (offline tests only).
  sh = args: derivation ({ inherit system; builder = "/bin/sh"; PATH = "/usr/bin:/bin"; } // args);
  placeholder = name: sh { inherit name; args = [ "-c" "echo ${name} > $out" ]; };
  mkDerivation = attrs: sh {
    name = attrs.name;
    args = [ "-c" "mkdir -p $out && echo 'stub build of ${attrs.name}' > $out/STUB" ];
  };
in rec {
  fetchurl = { url, sha256 }: placeholder "deb-${builtins.substring 0 12 sha256}";
  stdenv = { inherit mkDerivation; };
  runCommand = name: env: script: sh ({ inherit name; args = [ "-c" script ]; } // env);
  writeShellScriptBin = name: text: sh {
    inherit name;
    args = [ "-c" ''
      mkdir -p $out/bin
      cat > $out/bin/${name} <<'STUB_EOF'
#!/bin/sh
${text}
STUB_EOF
      chmod +x $out/bin/${name}
    '' ];
  };
  mkShell = { packages ? [ ], ... }: placeholder "shell";
  python311 = {
    withPackages = f: sh {
      name = "python-stub";
      args = [ "-c" "mkdir -p $out/bin && printf '#!/bin/sh\\nexec python3 \"$@\"\\n' > $out/bin/python && chmod +x $out/bin/python" ];
    };
  };
  llvmPackages_19 = { clang = placeholder "clang"; llvm = placeholder "llvm"; };
  lld_19 = placeholder "lld";
  bazel_7 = placeholder "bazel";
  qemu = placeholder "qemu";
  git = placeholder "git";
  dpkg = placeholder "dpkg";
  bubblewrap = placeholder "bubblewrap";
}
