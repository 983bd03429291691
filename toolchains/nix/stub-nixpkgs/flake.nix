{
  # A stand-in for nixpkgs with just the attributes this project's flake uses,
  # so the flake can be evaluated, checked and its bench app run on machines
  # that cannot fetch nixpkgs. Packages are placeholders built with /bin/sh;
  # python is the caller's python3 on PATH.
  description = "offline stub of nixpkgs for rvascend's flake tests";
  outputs = { self }: { };
}
