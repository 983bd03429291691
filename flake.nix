{
  description = "rvascend: RVV and AscendC kernels for LLM inference, driven from Python";

  # nixpkgs is pinned by flake.lock (rev + narHash). Offline, the flake is
  # evaluated against toolchains/nix/stub-nixpkgs (see docs/reproducibility.md, "Nix").
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      system = "x86_64-linux";
      pkgs = import nixpkgs { inherit system; };

      # Debian packages pinned by the project's lock files, as fixed-output
      # derivations: the same files and sha256 that `./dev setup` verifies.
      debsOf = lockFile:
        map (p: pkgs.fetchurl { url = "mirror://debian/${p.filename}"; sha256 = p.sha256; })
          (builtins.fromJSON (builtins.readFile lockFile)).packages;
      unpackedDebs = name: lockFile: extra: pkgs.stdenv.mkDerivation {
        inherit name;
        srcs = debsOf lockFile;
        nativeBuildInputs = [ pkgs.dpkg ];
        dontUnpack = true;
        installPhase = ''
          mkdir -p $out
          for deb in $srcs; do dpkg-deb -x $deb $out; done
          ${extra}
        '';
      };

      python = pkgs.python311.withPackages (ps: with ps; [
        torch pybind11 numpy pytest absl-py hypothesis safetensors tokenizers transformers fastapi uvicorn
        psutil openai prometheus-client tqdm matplotlib jinja2 httpx
      ]);

      # The package sources plus the host extensions, built without Bazel from the one
      # source list Bazel's own compile actions make (toolchains/nix/host_extensions.json),
      # by the builder the test suite runs too (rvascend/setup/host_extensions.py).
      kernels = pkgs.stdenv.mkDerivation {
        name = "rvascend-kernels";
        src = self;
        nativeBuildInputs = [ python pkgs.llvmPackages_19.clang ];
        buildPhase = ''
          PYTHONPATH=python python -m rvascend.setup.host_extensions --root . --out . --cxx clang++
        '';
        installPhase = ''
          mkdir -p $out/python/rvascend/_native
          cp -r python/rvascend $out/python/
          touch $out/python/rvascend/_native/__init__.py
          cp _rvv_kernels.so _recurrent_gated_delta_rule.so $out/python/rvascend/_native/
        '';
      };

      bench = pkgs.writeShellScriptBin "rvascend-bench" ''
        export PYTHONPATH=${kernels}/python:${self}/python''${PYTHONPATH:+:$PYTHONPATH}
        exec ${python}/bin/python -m rvascend.bench "$@"
      '';
    in {
      devShells.${system}.default = pkgs.mkShell {
        packages = [
          python pkgs.llvmPackages_19.clang pkgs.lld_19 pkgs.llvmPackages_19.llvm pkgs.bazel_7 pkgs.qemu
          pkgs.git pkgs.dpkg pkgs.bubblewrap
        ];
      };

      packages.${system} = {
        inherit kernels;
        default = kernels;
        qemu-user = unpackedDebs "qemu-user-debian13" ./toolchains/qemu/qemu.lock.json "";
        riscv64-image = unpackedDebs "riscv64-image-debian13" ./toolchains/riscv64_image/image.lock.json ''
          ln -s usr/lib $out/lib; ln -s usr/bin $out/bin; ln -s usr/sbin $out/sbin
          ln -s blas/libblas.so.3 $out/usr/lib/riscv64-linux-gnu/libblas.so.3
          ln -s lapack/liblapack.so.3 $out/usr/lib/riscv64-linux-gnu/liblapack.so.3
        '';
      };

      apps.${system}.bench = { type = "app"; program = "${bench}/bin/rvascend-bench"; };

      checks.${system} = {
        # Every locked .deb is a fixed-output derivation with the lock's sha256.
        locks = pkgs.runCommand "rvascend-locks-check" { debs = debsOf ./toolchains/riscv64_image/image.lock.json
          ++ debsOf ./toolchains/qemu/qemu.lock.json; } ''
          for d in $debs; do test -n "$d"; done
          echo ok > $out
        '';
        bench-app = pkgs.runCommand "rvascend-bench-app-check" { } ''
          grep -q "rvascend.bench" ${bench}/bin/rvascend-bench
          echo ok > $out
        '';
      };
    };
}
