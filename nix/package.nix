# rqsys as a Nix package: the Python application, its cffi spawn helper,
# the man pages (built by scdoc) and the systemd units with store paths, in
# $out/lib/systemd/system (for systemd.packages) and $out/share/rqsys/units.
{
  lib,
  python3,
  scdoc,
  coreutils,
  # Pool queues (docs/SCALING.md) need nats-py; nix/module.nix asks for it when a queue has a pool.
  withPool ? false,
}:

let
  py = python3.pkgs;
  # pyinotify imports asyncore, which left the standard library in Python 3.12.
  needsAsyncore = lib.versionAtLeast python3.pythonVersion "3.12";
  src = lib.cleanSourceWith {
    src = ../.;
    filter =
      path: type:
      let
        base = baseNameOf path;
      in
      !(builtins.elem base [
        ".venv"
        "build"
        "run-root"
        "result"
        ".git"
        "__pycache__"
        ".mypy_cache"
        ".ruff_cache"
        ".pytest_cache"
      ])
      && !(lib.hasSuffix ".egg-info" base);
  };
in
py.buildPythonApplication {
  pname = "rqsys";
  version = "0.2.0";
  pyproject = true;
  inherit src;

  build-system = [
    py.setuptools
    py.wheel
    py.cffi
  ];

  # scdoc runs in setup.py's install_data: the man pages land in share/man.
  nativeBuildInputs = [ scdoc ];
  RQSYS_REQUIRE_MAN = "1";

  dependencies =
    [
      py.cffi
      py.falcon
      py.waitress
      py.jsonschema
      py.pyinotify
      py.argon2-cffi
      py.croniter
      py.prometheus-client
      py.jeepney
      py.jinja2
      py.systemd
    ]
    ++ lib.optionals needsAsyncore [ py.pyasyncore ]
    ++ lib.optionals withPool [ py.nats-py ];

  # Units reference /usr/bin/rqsys and /bin/kill; point them at the store.
  postInstall = ''
    units=$out/share/rqsys/units
    for unit in $units/*.service $units/*.socket $units/*.target; do
      [ -e "$unit" ] || continue
      substituteInPlace "$unit" \
        --replace-quiet /usr/bin/rqsys $out/bin/rqsys \
        --replace-quiet /usr/bin/rq $out/bin/rq \
        --replace-quiet /bin/kill ${coreutils}/bin/kill
      install -Dm644 "$unit" -t $out/lib/systemd/system
    done
    for dir in sysusers.d tmpfiles.d; do
      if [ -d $units/$dir ]; then
        install -Dm644 $units/$dir/* -t $out/lib/$dir
      fi
    done
  '';

  pythonImportsCheck = [
    "rqsys"
    "rqsys._native._rqspawn"
  ];

  meta = {
    description = "Reliable, filesystem-backed message queue for any Unix language, systemd-native";
    license = lib.licenses.mit;
    platforms = lib.platforms.linux;
    mainProgram = "rqsys";
  };
}
