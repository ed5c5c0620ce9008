# services.rq: rqsys on NixOS.
#
# The upstream units (rq@.socket, rq@.service, rq-web.*, rq-scan.service,
# rq-relay-worker.*) come from the package through systemd.packages; this module only adds
# drop-ins (state directory, user, web address) and enables instances.
# Each services.rq.queues.<name> becomes a scandir entry (a store directory
# holding `run` and `config.json`) linked into <stateDir>/scandir by
# tmpfiles, plus an enabled rq@<name>.socket; each timers.<name> becomes
# <stateDir>/timers/<name>.json, each triggers.<name> (its JSON as given)
# <stateDir>/triggers/<name>.json (docs/TRIGGERS.md).  Secrets (basic auth) are read from a file
# at service start and never copied into the store; web.users gives them
# roles, merged with their hashes then.
#
# What rq-scan writes as drop-ins elsewhere (a queue's user and credentials)
# this module generates, /etc/systemd/system being Nix's: each such queue
# gets a drop-in of its own on rq@<name>.service (queueService).
#
# A queue with `pool` is a pool queue (docs/SCALING.md): its config names the
# pool, its rq@<name>.service runs from boot, and the package is built with
# nats-py; services.rq.nats names the NATS servers, and nats.server runs one
# here through nixpkgs' services.nats (JetStream on, clustered by routes).
#
# Uses only builtins and these lib functions: mkOption mkEnableOption mkIf
# mkMerge types (bool str path package attrs port strMatching ints.between
# enum nullOr either listOf attrsOf submodule) mapAttrs' mapAttrsToList
# nameValuePair optional optionals optionalAttrs filterAttrs hasPrefix
# (nix/tests/lib-stub.nix provides them).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    mkOption
    mkEnableOption
    mkIf
    mkMerge
    types
    ;
  cfg = config.services.rq;
  poolQueues = lib.filterAttrs (_: q: q.pool != null) cfg.queues;
  rqPackage =
    if cfg.package != null then
      cfg.package
    else
      pkgs.callPackage ./package.nix { withPool = poolQueues != { }; };
  natsServer = cfg.nats.server;
  natsServers =
    if cfg.nats.servers != [ ] then
      cfg.nats.servers
    else
      lib.optional natsServer.enable "nats://127.0.0.1:${toString natsServer.port}";

  poolOptions = {
    options = {
      name = mkOption {
        type = types.strMatching "[A-Za-z0-9][A-Za-z0-9_-]{0,63}";
        description = "The pool: every host whose queue names it works the same queue.";
      };
      replicas = mkOption {
        type = types.ints.between 1 5;
        default = 3;
        description = "Copies JetStream keeps of the pool's stream, bucket and attachments.";
      };
      ackWait = mkOption {
        type = types.ints.between 1 3600;
        default = 30;
        description = "Seconds a host may be silent before its running message goes to another host.";
      };
    };
  };

  queueOptions = {
    options = {
      script = mkOption {
        type = types.path;
        description = "Executable run for each message (see rq-queue-script(7)).";
      };
      numWorkers = mkOption {
        type = types.ints.between 1 128;
        default = 1;
        description = "Messages of this queue run at the same time.";
      };
      execPrefix = mkOption {
        type = types.str;
        default = "";
        example = "bash -lc";
        description = "Words put before the script path at exec; empty runs it directly.";
      };
      envVars = mkOption {
        type = types.attrsOf types.str;
        default = { };
        description = "Environment for the script (names may not start with RQ_).";
      };
      coalesceParams = mkOption {
        type = types.listOf (types.ints.between 1 4);
        default = [ ];
        description = "Param numbers: identical queued messages run once with the running one.";
      };
      blockingParams = mkOption {
        type = types.listOf (types.ints.between 1 4);
        default = [ ];
        description = "Param numbers: one running message per distinct tuple.";
      };
      settings = mkOption {
        type = types.attrs;
        default = { };
        example = {
          idle_timeout = 300;
          stop_grace = 30;
        };
        description = "Other fields of the queue's config.json (rqsys.json(5)).";
      };
      form = mkOption {
        type = types.nullOr types.attrs;
        default = null;
        description = "The queue's form.json for the web UI, or null for none.";
      };
      pool = mkOption {
        type = types.nullOr (types.submodule poolOptions);
        default = null;
        example = {
          name = "transcode";
          replicas = 3;
        };
        description = "Make this a pool queue, worked by many hosts through NATS JetStream (docs/SCALING.md); its daemon then runs from boot.";
      };
      user = mkOption {
        type = types.nullOr (types.strMatching "[A-Za-z_][A-Za-z0-9_.-]{0,31}");
        default = null;
        example = "dynamic";
        description = ''
          The Unix user the queue's daemon and scripts run as (config.json `user`): an
          existing user, or "dynamic" for systemd's DynamicUser= (as rq-<name>, so the
          queue name may have at most 28 characters).  Its rq@<name>.service gets what
          rq-scan's drop-in would give it; rqsys queue-owner hands the queue's directory
          to it before each start.
        '';
      };
      credentials = mkOption {
        type = types.attrsOf (types.either credentialPath (types.submodule encryptedOptions));
        default = { };
        example = {
          token = "/run/secrets/api-token";
          db = {
            encrypted = "/etc/credstore.encrypted/db";
          };
        };
        description = ''
          Secrets the script reads in $CREDENTIALS_DIRECTORY/NAME (config.json
          `credentials`): NAME to a file's absolute path (LoadCredential=), or to
          { encrypted = path; } for a file systemd-creds encrypt made
          (LoadCredentialEncrypted=).  Paths outside the store, as strings.
        '';
      };
    };
  };

  credentialPath = types.strMatching "/.+";
  encryptedOptions = {
    options.encrypted = mkOption {
      type = credentialPath;
      description = "A file systemd-creds encrypt made (LoadCredentialEncrypted=).";
    };
  };

  webUserOptions = {
    options = {
      role = mkOption {
        type = types.enum [
          "viewer"
          "operator"
          "admin"
        ];
        default = "admin";
        description = "viewer: every read; operator: also what changes messages; admin: also what changes queues.";
      };
      queues = mkOption {
        type = types.listOf (types.strMatching ".+");
        default = [ ];
        example = [ "etl-*" ];
        description = "Shell globs of the queues the user sees and acts on; empty: all.";
      };
    };
  };

  timerOptions = {
    options = {
      period = mkOption {
        type = types.nullOr (types.ints.between 60 31622400);
        default = null;
        description = "Seconds between two messages (or calendar, or cron).";
      };
      calendar = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "Mon..Fri *-*-* 02:00:00";
        description = "A systemd calendar expression: one message per slot.";
      };
      cron = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "*/15 * * * *";
        description = "A 5-field cron expression: one message per slot.";
      };
      timezone = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "IANA zone of calendar or cron (default: the host's).";
      };
      persistent = mkOption {
        type = types.bool;
        default = true;
        description = "calendar/cron: a slot missed while down fires once at start.";
      };
      jitter = mkOption {
        type = types.ints.between 0 86400;
        default = 0;
        description = "calendar/cron: seconds of random delay after each slot.";
      };
      unique = mkOption {
        type = types.bool;
        default = true;
        description = "calendar/cron: one message per slot, by a unique key.";
      };
      overlap = mkOption {
        type = types.enum [
          "queue"
          "skip"
        ];
        default = "queue";
        description = "skip: no message while the timer's last one is queued or running.";
      };
      msg = mkOption {
        type = types.attrsOf types.str;
        example = {
          dest = "cleaner";
          param1 = "30";
        };
        description = "The message: dest (required) and param1..param4.";
      };
    };
  };

  queueConfigJson =
    q:
    builtins.toJSON (
      q.settings
      // {
        num_workers = q.numWorkers;
        exec_prefix = q.execPrefix;
        env_vars = q.envVars;
        coalesce_params = q.coalesceParams;
        blocking_params = q.blockingParams;
      }
      // lib.optionalAttrs (q.pool != null) {
        pool = {
          inherit (q.pool) name replicas;
          ack_wait = q.pool.ackWait;
        };
      }
      // lib.optionalAttrs (q.user != null) { inherit (q) user; }
      // lib.optionalAttrs (q.credentials != { }) {
        credentials = builtins.mapAttrs (
          _: c: if builtins.isString c then c else { inherit (c) encrypted; }
        ) q.credentials;
      }
    );

  scandirEntry =
    name: q:
    pkgs.linkFarm "rq-queue-${name}" (
      [
        {
          name = "run";
          path = q.script;
        }
        {
          name = "config.json";
          path = pkgs.writeText "rq-queue-${name}-config.json" (queueConfigJson q);
        }
      ]
      ++ lib.optional (q.form != null) {
        name = "form.json";
        path = pkgs.writeText "rq-queue-${name}-form.json" (builtins.toJSON q.form);
      }
    );

  scandirEntries = builtins.mapAttrs scandirEntry cfg.queues;

  timerFile =
    name: t:
    pkgs.writeText "rq-timer-${name}.json" (
      builtins.toJSON (
        lib.filterAttrs (_: v: v != null) { inherit (t) period calendar cron msg; }
        // lib.optionalAttrs (t.overlap != "queue") { inherit (t) overlap; }
        // lib.optionalAttrs (t.period == null) (
          { inherit (t) persistent unique; }
          // lib.filterAttrs (_: v: v != null && v != 0) { inherit (t) timezone jitter; }
        )
      )
    );
  timerFiles = builtins.mapAttrs timerFile cfg.timers;

  # A trigger file is its JSON as given (rqsys checks it against trigger.json
  # when it reads it; a secret is only named there, never in the store).
  triggerFile = name: t: pkgs.writeText "rq-trigger-${name}.json" (builtins.toJSON t);
  triggerFiles = builtins.mapAttrs triggerFile cfg.triggers;
  badTriggerNames = builtins.filter (
    n: builtins.match "[A-Za-z0-9][A-Za-z0-9_-]{0,99}" n == null
  ) (builtins.attrNames cfg.triggers);

  # config/config.json without secrets; basic_auth is merged in at start.
  publicConfig = pkgs.writeText "rq-config.json" (
    builtins.toJSON (
      {
        port = cfg.web.port;
        addr = cfg.web.address;
        relative_root = cfg.web.relativeRoot;
      }
      // lib.optionalAttrs (cfg.host != null) { inherit (cfg) host; }
      // lib.optionalAttrs (cfg.web.allowedHosts != [ ]) { allowed_hosts = cfg.web.allowedHosts; }
      // lib.optionalAttrs (natsServers != [ ]) { nats = natsConfig; }
    )
  );
  natsConfig =
    {
      servers = natsServers;
      connect_timeout = cfg.nats.connectTimeout;
    }
    // lib.optionalAttrs (cfg.nats.credsFile != null) { creds = cfg.nats.credsFile; }
    // lib.optionalAttrs (tls != { }) { inherit tls; };
  tls = lib.filterAttrs (_: v: v != null) cfg.nats.tls;

  # web.users: each user's role and queues (not secret), merged at start with
  # the password hashes of basicAuthFile (secret, never in the store) by
  # authFilter.  A named user missing from the file fails rq-config.service:
  # no user is ever written without a password.
  webRoles = pkgs.writeText "rq-web-users.json" (
    builtins.toJSON (
      builtins.mapAttrs (
        _: u: { inherit (u) role; } // lib.optionalAttrs (u.queues != [ ]) { inherit (u) queues; }
      ) cfg.web.users
    )
  );
  authFilter = pkgs.writeText "rq-basic-auth.jq" ''
    def hash: if type == "object" then .password else . end;
    def account($role): (if type == "object" then del(.role, .queues) else {password: .} end) + $role;
    $auth[0] as $file
    | $roles[0] as $roles
    | if ($file | type) != "object" or ($file.users | type) != "object" then
        error($authFile + ": not a JSON object with \"users\" (services.rq.web.basicAuthFile)")
      else . end
    | [$roles | keys[] | . as $u | select(($file.users[$u] | hash) as $h | ($h | type) != "string" or $h == "")] as $missing
    | if $missing != [] then
        error("services.rq.web.users: no password hash for " + ($missing | join(", "))
              + " in " + $authFile + " (services.rq.web.basicAuthFile); config.json not written")
      else
        . + {basic_auth: ($file | .users |= with_entries(.key as $u
               | if $roles[$u] then .value |= account($roles[$u]) else . end))}
      end
  '';

  writeConfig = ''
    set -eu
    umask 027
    dir=${cfg.stateDir}/config
    mkdir -p "$dir"
    ${
      if cfg.web.basicAuthFile == null then
        ''cp ${publicConfig} "$dir/config.json.tmp"''
      else
        ''${pkgs.jq}/bin/jq --arg authFile ${toString cfg.web.basicAuthFile} --slurpfile auth ${toString cfg.web.basicAuthFile} --slurpfile roles ${webRoles} -f ${authFilter} ${publicConfig} > "$dir/config.json.tmp"''
    }
    chown ${cfg.user}:${cfg.group} "$dir/config.json.tmp"
    mv "$dir/config.json.tmp" "$dir/config.json"
  '';

  # Drop-in pieces shared by every rqsys service.
  serviceDropIn = {
    environment.RQ_ROOT = cfg.stateDir;
    after = [ "rq-config.service" ];
    wants = [ "rq-config.service" ];
    # "" drops upstream's ReadWritePaths=/var/lib/rq, which must exist to be mounted.
    serviceConfig.ReadWritePaths = [
      ""
      cfg.stateDir
    ];
  };
  unprivileged = {
    serviceConfig = {
      User = cfg.user;
      Group = cfg.group;
    };
  };

  # A queue's own drop-in, rq@<name>.service.d/overrides.conf.  NixOS names the
  # template's rq@.service.d/overrides.conf alike, and systemd reads only the
  # instance's of two drop-ins of one name: so it repeats the template's whole
  # (serviceDropIn, and unprivileged unless the queue has a user of its own).
  queueService =
    name: q:
    mkMerge [
      serviceDropIn
      (if q.user == null then unprivileged else queueUser name q.user)
      (queueCredentials q.credentials)
      { overrideStrategy = "asDropin"; }
      # A pool queue's daemon pulls: it runs from boot, after a local NATS.
      (lib.optionalAttrs (q.pool != null) {
        wantedBy = [ "multi-user.target" ];
        after = lib.optional natsServer.enable "nats.service";
        wants = lib.optional natsServer.enable "nats.service";
      })
    ];
  # What rqsys/run/unituser.py's drop-in gives: a named user with its own
  # primary group (the empty Group= resets upstream's Group=rq, and systemd
  # then takes the user's primary group from the user database at start, as
  # rq-scan looks it up; the user need not be declared in users.users), or a
  # DynamicUser= named as rqsys's identity.dynamic_name does for names of at
  # most 28 characters (asserted), keeping group cfg.group as rq-scan's does.
  queueUser = name: user: {
    serviceConfig =
      (
        if user == "dynamic" then
          {
            DynamicUser = "yes";
            User = "rq-${name}";
            Group = cfg.group;
          }
        else
          {
            User = user;
            Group = "";
            RemoveIPC = "no";
          }
      )
      // {
        SupplementaryGroups = [ cfg.group ];
        ExecStartPre = [ "+${rqPackage}/bin/rqsys queue-owner %i" ];
      };
  };
  # What rqsys/run/credentials.py's drop-in gives (% is a specifier there).
  queueCredentials =
    creds:
    let
      lines =
        encrypted:
        lib.mapAttrsToList (n: c: "${n}:${builtins.replaceStrings [ "%" ] [ "%%" ] (credentialFile c)}") (
          lib.filterAttrs (_: c: builtins.isString c != encrypted) creds
        );
      plain = lines false;
      sealed = lines true;
    in
    {
      serviceConfig =
        lib.optionalAttrs (plain != [ ]) { LoadCredential = plain; }
        // lib.optionalAttrs (sealed != [ ]) { LoadCredentialEncrypted = sealed; };
    };
  credentialFile = c: if builtins.isString c then c else c.encrypted;
  # Queues whose rq@<name>.service needs a drop-in of its own.
  ownServiceQueues = lib.filterAttrs (
    _: q: q.pool != null || q.user != null || q.credentials != { }
  ) cfg.queues;

  badEnvVars = lib.filterAttrs (
    _: q: builtins.any (n: lib.hasPrefix "RQ_" n) (builtins.attrNames q.envVars)
  ) cfg.queues;
  msgFields = [ "dest" "param1" "param2" "param3" "param4" ];
  badSchedules = lib.filterAttrs (
    _: t: builtins.length (builtins.filter (v: v != null) [ t.period t.calendar t.cron ]) != 1
  ) cfg.timers;
  badTimers = lib.filterAttrs (
    _: t: !(t.msg ? dest) || builtins.any (k: !(builtins.elem k msgFields)) (builtins.attrNames t.msg)
  ) cfg.timers;
  badNames = builtins.filter (n: builtins.match "[A-Za-z0-9][A-Za-z0-9_-]{0,63}" n == null) (
    builtins.attrNames cfg.queues
  );
  # rqsys names a dynamic user rq-<queue>, shortened past 31 characters with a crc32.
  longDynamic = builtins.attrNames (
    lib.filterAttrs (n: q: q.user == "dynamic" && builtins.stringLength n > 28) cfg.queues
  );
  eachCredential =
    f:
    builtins.concatLists (
      lib.mapAttrsToList (
        qn: q: builtins.filter (x: x != null) (lib.mapAttrsToList (n: c: f "${qn}.${n}" n c) q.credentials)
      ) cfg.queues
    );
  storeCredentials = eachCredential (
    where: _: c: if lib.hasPrefix "/nix/store" (credentialFile c) then where else null
  );
  badCredentialNames = eachCredential (
    where: n: _:
    if builtins.match "[A-Za-z0-9_.-]{1,255}" n == null || n == "." || n == ".." then where else null
  );
in
{
  options.services.rq = {
    enable = mkEnableOption "rqsys, the filesystem-backed message queue";

    package = mkOption {
      type = types.nullOr types.package;
      default = null;
      description = "The rqsys package; null builds nix/package.nix.";
    };

    stateDir = mkOption {
      type = types.str;
      default = "/var/lib/rq";
      description = "Where queues, messages, scandir and timers live.";
    };

    user = mkOption {
      type = types.str;
      default = "rq";
      description = "User the queue daemons, their scripts and the web run as.";
    };

    group = mkOption {
      type = types.str;
      default = "rq";
      description = "Group of the state directory and the queue sockets.";
    };

    host = mkOption {
      type = types.nullOr types.str;
      default = null;
      description = "Host name in message URLs; null uses the machine's host name.";
    };

    web = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = "Whether to listen for HTTP (rq-web.socket).";
      };
      port = mkOption {
        type = types.port;
        default = 3333;
        description = "Web port.";
      };
      address = mkOption {
        type = types.str;
        default = "127.0.0.1";
        description = "Web listen address (a non-loopback one needs basicAuth, or rqsys refuses to start the web).";
      };
      relativeRoot = mkOption {
        type = types.strMatching "/.*";
        default = "/";
        description = "Path prefix of every web route (behind a reverse proxy).";
      };
      allowedHosts = mkOption {
        type = types.listOf types.str;
        default = [ ];
        description = "More DNS names the web answers to, besides host, the machine's name and localhost (others are refused 421: DNS rebinding).";
      };
      basicAuthFile = mkOption {
        type = types.nullOr types.path;
        default = null;
        example = "/run/secrets/rq-basic-auth.json";
        description = ''
          A JSON file {"realm": ..., "users": {"name": "$argon2id$..."}} enabling basic
          authentication (rqsys passwd prints a hash). Read at start by root; never
          copied into the store (give a path as a string, not a Nix path literal).
          A user it names that web.users does not is an admin of every queue.
        '';
      };
      users = mkOption {
        type = types.attrsOf (types.submodule webUserOptions);
        default = { };
        example = {
          alice.role = "viewer";
          etl = {
            role = "operator";
            queues = [ "etl-*" ];
          };
        };
        description = ''
          Roles of basicAuthFile's users (docs/SECURITY.md, Roles): each becomes
          {"password": <its hash from the file>, "role": ..., "queues": [...]} in
          config.json at start.  A user named here but not in the file fails
          rq-config.service rather than be written without a password.
        '';
      };
    };

    queues = mkOption {
      type = types.attrsOf (types.submodule queueOptions);
      default = { };
      description = "Queues: each becomes a scandir entry and an enabled rq@<name>.socket.";
    };

    timers = mkOption {
      type = types.attrsOf (types.submodule timerOptions);
      default = { };
      description = "Timers: each sends its message every period seconds, or at each slot of a calendar or cron expression.";
    };

    triggers = mkOption {
      type = types.attrsOf types.attrs;
      default = { };
      example = {
        incoming = {
          files = { path = "/srv/incoming"; glob = "*.csv"; };
          msg.dest = "ingest";
        };
      };
      description = "Triggers: each is written as <stateDir>/triggers/<name>.json, its JSON as given (a webhook, files dropped in a directory; docs/TRIGGERS.md).";
    };

    nats = {
      servers = mkOption {
        type = types.listOf (types.strMatching "(nats|tls)://[^ ]+");
        default = [ ];
        example = [
          "nats://10.0.0.1:4222"
          "nats://10.0.0.2:4222"
          "nats://10.0.0.3:4222"
        ];
        description = "NATS servers of the pool queues (config.json nats.servers); empty with nats.server.enable: the local one.";
      };
      credsFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/run/secrets/rq-pool.creds";
        description = "A NATS credentials file, read by the queue daemons (a path outside the store).";
      };
      tls = {
        ca = mkOption {
          type = types.nullOr types.str;
          default = null;
          description = "CA file of the NATS servers' certificates.";
        };
        cert = mkOption {
          type = types.nullOr types.str;
          default = null;
          description = "Client certificate for the NATS servers.";
        };
        key = mkOption {
          type = types.nullOr types.str;
          default = null;
          description = "Key of the client certificate.";
        };
      };
      connectTimeout = mkOption {
        type = types.ints.between 1 60;
        default = 3;
        description = "Seconds a pool queue's daemon waits for a server at start.";
      };
      server = {
        enable = mkEnableOption "a nats-server beside rqsys (nixpkgs' services.nats), JetStream on, clustered through routes";
        name = mkOption {
          type = types.nullOr types.str;
          default = null;
          description = "The server's name in the cluster; null uses services.rq.host.";
        };
        port = mkOption {
          type = types.port;
          default = 4222;
          description = "Client port.";
        };
        clusterName = mkOption {
          type = types.str;
          default = "rq";
          description = "The cluster's name (the same on every server).";
        };
        clusterPort = mkOption {
          type = types.port;
          default = 6222;
          description = "Port of the routes between the servers.";
        };
        routes = mkOption {
          type = types.listOf types.str;
          default = [ ];
          example = [
            "nats-route://10.0.0.2:6222"
            "nats-route://10.0.0.3:6222"
          ];
          description = "The other servers of the cluster (a pool with replicas 3 needs three servers).";
        };
        monitorPort = mkOption {
          type = types.nullOr types.port;
          default = 8222;
          description = "HTTP monitoring port (/healthz, /jsz), or null for none.";
        };
        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = "Open the client and cluster ports.";
        };
      };
    };

    generated = mkOption {
      type = types.attrs;
      readOnly = true;
      internal = true;
      description = "The generated scandir entries, timer and trigger files, by name (for inspection).";
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = badNames == [ ];
          message = "services.rq.queues: invalid queue name(s): ${builtins.concatStringsSep ", " badNames}";
        }
        {
          assertion = badEnvVars == { };
          message = "services.rq.queues.<name>.envVars cannot set RQ_* variables (queues: ${builtins.concatStringsSep ", " (builtins.attrNames badEnvVars)})";
        }
        {
          assertion = badTriggerNames == [ ];
          message = "services.rq.triggers: invalid trigger name(s): ${builtins.concatStringsSep ", " badTriggerNames}";
        }
        {
          assertion = badSchedules == { };
          message = "services.rq.timers.<name> needs exactly one of period, calendar and cron (timers: ${builtins.concatStringsSep ", " (builtins.attrNames badSchedules)})";
        }
        {
          assertion = badTimers == { };
          message = "services.rq.timers.<name>.msg needs a dest and may only have dest, param1..param4 (timers: ${builtins.concatStringsSep ", " (builtins.attrNames badTimers)})";
        }
        {
          assertion = poolQueues == { } || natsServers != [ ];
          message = "services.rq.queues.<name>.pool needs services.rq.nats.servers or services.rq.nats.server.enable (queues: ${builtins.concatStringsSep ", " (builtins.attrNames poolQueues)})";
        }
        {
          assertion = !natsServer.enable || natsServer.name != null || cfg.host != null;
          message = "services.rq.nats.server needs a name (services.rq.nats.server.name or services.rq.host)";
        }
        {
          assertion = !(lib.hasPrefix "/nix/store" (toString cfg.nats.credsFile));
          message = "services.rq.nats.credsFile is in the Nix store, readable by everyone; give a path outside it";
        }
        {
          assertion = !(lib.hasPrefix "/nix/store" (toString cfg.web.basicAuthFile));
          message = "services.rq.web.basicAuthFile is in the Nix store, readable by everyone; give a path outside it";
        }
        {
          assertion = cfg.web.users == { } || cfg.web.basicAuthFile != null;
          message = "services.rq.web.users needs services.rq.web.basicAuthFile, which holds their password hashes (users: ${builtins.concatStringsSep ", " (builtins.attrNames cfg.web.users)})";
        }
        {
          assertion = longDynamic == [ ];
          message = "services.rq.queues.<name>.user = \"dynamic\" needs a queue name of at most 28 characters: rqsys shortens a longer rq-<name> with a crc32, which Nix cannot compute for the unit's User= (queues: ${builtins.concatStringsSep ", " longDynamic})";
        }
        {
          assertion = storeCredentials == [ ];
          message = "services.rq.queues.<name>.credentials are in the Nix store, readable by everyone; give paths outside it (credentials: ${builtins.concatStringsSep ", " storeCredentials})";
        }
        {
          assertion = badCredentialNames == [ ];
          message = "services.rq.queues.<name>.credentials: a name is letters, digits, _, - and . (not . or ..), at most 255 (credentials: ${builtins.concatStringsSep ", " badCredentialNames})";
        }
      ];

      services.rq.generated = {
        scandir = scandirEntries;
        timers = timerFiles;
        triggers = triggerFiles;
      };

      environment.systemPackages = [ rqPackage ];
      systemd.packages = [ rqPackage ];

      users.users = lib.optionalAttrs (cfg.user == "rq") {
        rq = {
          isSystemUser = true;
          group = cfg.group;
          home = cfg.stateDir;
          description = "rqsys message queues";
        };
      };
      # rq-web: the console's group (rq-web.service's SupplementaryGroups=): it
      # reads the directories of queues with users of their own (group rq-web,
      # 2750, made so by rqsys queue-owner, which fails without the group).
      users.groups = lib.optionalAttrs (cfg.group == "rq") { rq = { }; } // {
        rq-web = { };
      };

      systemd.tmpfiles.rules =
        map (d: "d ${cfg.stateDir}${d} 0750 ${cfg.user} ${cfg.group} -") [
          ""
          "/config"
          "/scandir"
          "/timers"
          "/triggers"
          "/triggers/.state" # each trigger's record: rq-web's (webhooks) and rq-scan's (files)
          "/queue"
          "/trash"
          "/tmp"
        ]
        # Written by every queue daemon, those running as users of their own too
        # (group cfg.group, their SupplementaryGroups=).
        ++ map (d: "d ${cfg.stateDir}${d} 2770 ${cfg.user} ${cfg.group} -") [
          "/audit"
          "/batches"
        ]
        ++ [ "d /run/rq 0755 root root -" ]
        ++ lib.mapAttrsToList (
          name: entry: "L+ ${cfg.stateDir}/scandir/${name} - - - - ${entry}"
        ) scandirEntries
        ++ lib.mapAttrsToList (
          name: file: "L+ ${cfg.stateDir}/timers/${name}.json - - - - ${file}"
        ) timerFiles
        ++ lib.mapAttrsToList (
          name: file: "L+ ${cfg.stateDir}/triggers/${name}.json - - - - ${file}"
        ) triggerFiles;

      # Writes config/config.json (merging the basic-auth secret) before any daemon reads it.
      systemd.services.rq-config = {
        description = "rqsys configuration";
        after = [ "systemd-tmpfiles-setup.service" ];
        restartTriggers = [
          publicConfig
        ]
        ++ lib.optionals (cfg.web.basicAuthFile != null) [
          webRoles
          authFilter
        ];
        script = writeConfig;
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
        };
      };

      # Drop-ins on the upstream units.
      systemd.services."rq@" = mkMerge [
        serviceDropIn
        unprivileged
        { overrideStrategy = "asDropin"; }
      ];
      systemd.services.rq-scan = mkMerge [
        serviceDropIn
        {
          wantedBy = [ "multi-user.target" ];
          restartTriggers = builtins.attrValues scandirEntries;
        }
      ];
      systemd.sockets."rq@" = {
        overrideStrategy = "asDropin";
        socketConfig.SocketGroup = cfg.group;
      };
      # The relay worker: rq@ services Want its socket, so it needs no enabling.
      systemd.services.rq-relay-worker = mkMerge [
        serviceDropIn
        unprivileged
      ];
      systemd.sockets.rq-relay-worker.socketConfig.SocketGroup = cfg.group;
    }

    # One enabled socket per declared queue (its overrides.conf hides the
    # template's, as queueService says: so it repeats SocketGroup=).
    {
      systemd.sockets = lib.mapAttrs' (
        name: _:
        lib.nameValuePair "rq@${name}" {
          overrideStrategy = "asDropin";
          wantedBy = [ "sockets.target" ];
          socketConfig.SocketGroup = cfg.group;
        }
      ) cfg.queues;
    }

    # What rq-scan's drop-ins would give a queue (it cannot write them: NixOS
    # makes /etc/systemd/system): its user, its credentials; and a pool
    # queue's start at boot.
    {
      systemd.services = lib.mapAttrs' (
        name: q: lib.nameValuePair "rq@${name}" (queueService name q)
      ) ownServiceQueues;
    }

    (mkIf natsServer.enable {
      services.nats = {
        enable = true;
        jetstream = true;
        serverName = if natsServer.name != null then natsServer.name else cfg.host;
        port = natsServer.port;
        settings =
          {
            cluster = {
              name = natsServer.clusterName;
              port = natsServer.clusterPort;
              routes = natsServer.routes;
            };
          }
          // lib.optionalAttrs (natsServer.monitorPort != null) {
            http_port = natsServer.monitorPort;
          };
      };
      networking.firewall.allowedTCPPorts = lib.optionals natsServer.openFirewall [
        natsServer.port
        natsServer.clusterPort
      ];
    })

    (mkIf cfg.web.enable {
      systemd.services.rq-web = mkMerge [
        serviceDropIn
        unprivileged
        # The console reads the queues of users of their own (group rq-web, 2750).
        { serviceConfig.SupplementaryGroups = [ "rq-web" ]; }
      ];
      systemd.sockets.rq-web = {
        wantedBy = [ "sockets.target" ];
        # The empty entry resets the upstream ListenStream=127.0.0.1:3333.
        listenStreams = [
          ""
          "${cfg.web.address}:${toString cfg.web.port}"
        ];
      };
    })
  ]);
}
