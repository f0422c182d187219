//! What an operator installs and runs: the Debian package (`cargo deb`) with its
//! configuration, systemd unit and user; `tlsterm --version`; readiness, reload and stop
//! reported to a service manager through NOTIFY_SOCKET.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::common::*;

/// `--version` names the release, the commit and the engine's kernels.
#[test]
fn version_names_commit_and_kernels() {
    let out = run(Command::new(TLSTERM).arg("--version"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("tlsterm {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(!text.contains("(commit )"), "{text}");
    let built = text
        .lines()
        .find(|l| l.starts_with("engine kernels built in:"))
        .expect(&text);
    assert!(
        built.contains("RSA") && built.contains("portable") && built.contains("X25519"),
        "{text}"
    );
    let runs = text
        .lines()
        .find(|l| l.starts_with("this CPU runs:"))
        .expect(&text);
    // Every CPU runs the portable kernels.
    assert!(runs.matches("portable").count() == 2, "{text}");
}

/// The configurations the package and the container image install start as they are.
#[test]
fn packaged_configurations_pass_the_check() {
    for file in ["packaging/tlsterm.toml", "packaging/container.toml"] {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        run(Command::new(TLSTERM)
            .args(["serve", "--check", "-c"])
            .arg(&config));
    }
}

/// Reads one datagram from the notify socket: the states tlsterm sent, one per line.
fn next_notice(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    // Another test of this process may have a signal handler (tokio's, for child
    // processes): a signal it catches interrupts the wait, which then goes on.
    let len = loop {
        match socket.recv(&mut buf) {
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            received => break received.expect("a notice before the deadline"),
        }
    };
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// READY=1 once serving (with a status naming the listener), RELOADING=1 then READY=1
/// around a SIGHUP, STOPPING=1 on SIGTERM.
#[test]
fn service_manager_hears_ready_reloading_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    let port = free_port();
    let listener = format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]");
    let config = write_config(dir.path(), "", &[listener]);
    let mut child = Command::new(TLSTERM)
        .args(["serve", "-c"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let kill = |signal: &str| run(Command::new("kill").args([signal, &child.id().to_string()]));

    let ready = next_notice(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(
        ready.contains(&format!("STATUS=serving 127.0.0.1:{port} on 2 workers")),
        "{ready}"
    );

    kill("-HUP");
    let reloading = next_notice(&socket);
    assert!(reloading.lines().any(|l| l == "RELOADING=1"), "{reloading}");
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{reloading}"
    );
    let ready_again = next_notice(&socket);
    assert!(ready_again.lines().any(|l| l == "READY=1"), "{ready_again}");

    kill("-TERM");
    let stopping = next_notice(&socket);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
    assert!(child.wait().unwrap().success());
}

/// The package built by `cargo deb` from this build's binary, once for every test of this
/// file (it takes seconds of CPU), in cargo's directory for test files; `None` (and a line
/// saying so) where cargo-deb is not installed.
fn package() -> Option<&'static Path> {
    static PACKAGE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let package = PACKAGE.get_or_init(|| {
        let has_cargo_deb = Command::new("cargo")
            .args(["deb", "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_cargo_deb {
            return None;
        }
        let out = run(Command::new("cargo")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["deb", "--no-build", "--no-strip", "--output"])
            .arg(env!("CARGO_TARGET_TMPDIR")));
        let path = String::from_utf8_lossy(&out.stdout)
            .trim()
            .lines()
            .last()
            .map(PathBuf::from);
        let path = path.filter(|p| p.extension().is_some_and(|e| e == "deb"));
        Some(path.expect("cargo deb prints the package's path"))
    });
    if package.is_none() {
        eprintln!("skipped: cargo-deb is not installed (scripts/setup.sh installs it)");
    }
    package.as_deref()
}

fn dpkg_deb(args: &[&str], package: &Path) -> String {
    let out = run(Command::new("dpkg-deb").args(args).arg(package));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package holds the binary, the configuration (a conffile), the documentation and a
/// hardened notify unit, and its postinst creates the system user.
#[test]
fn debian_package_holds_binary_configuration_unit_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let Some(package) = package() else {
        return;
    };
    let files = dpkg_deb(&["--contents"], package);
    let mode_of = |path: &str| {
        let line = files
            .lines()
            .find(|l| l.ends_with(path))
            .unwrap_or_else(|| panic!("{path} missing:\n{files}"));
        line.split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(mode_of("/usr/bin/tlsterm"), "-rwxr-xr-x");
    assert_eq!(mode_of("/etc/tlsterm/tlsterm.toml"), "-rw-r--r--");
    assert_eq!(
        mode_of("/usr/share/doc/tlsterm/tlsterm.example.toml"),
        "-rw-r--r--"
    );
    assert_eq!(mode_of("/system/tlsterm.service"), "-rw-r--r--");

    let control = dpkg_deb(&["--field"], package);
    assert!(control.contains("Package: tlsterm"), "{control}");
    let depends = control
        .lines()
        .find(|l| l.starts_with("Depends:"))
        .expect(&control);
    // procps has /bin/kill, which the unit's ExecReload runs.
    assert!(
        ["libc6", "adduser", "procps"]
            .iter()
            .all(|package| depends.contains(package)),
        "{control}"
    );

    let info = dir.path().join("control");
    run(Command::new("dpkg-deb")
        .arg("--control")
        .arg(package)
        .arg(&info));
    let conffiles = std::fs::read_to_string(info.join("conffiles")).unwrap();
    assert!(
        conffiles.lines().any(|l| l == "/etc/tlsterm/tlsterm.toml"),
        "{conffiles}"
    );
    let postinst = std::fs::read_to_string(info.join("postinst")).unwrap();
    assert!(postinst.contains("adduser --system --group"), "{postinst}");
    assert!(postinst.contains("deb-systemd-helper"), "{postinst}");

    let tree = dir.path().join("tree");
    run(Command::new("dpkg-deb")
        .arg("--extract")
        .arg(package)
        .arg(&tree));
    let unit_path = files
        .lines()
        .find(|l| l.ends_with("/system/tlsterm.service"))
        .unwrap();
    let unit_path = unit_path
        .rsplit(' ')
        .next()
        .unwrap()
        .trim_start_matches("./");
    let unit = std::fs::read_to_string(tree.join(unit_path)).unwrap();
    for line in [
        "Type=notify",
        "User=tlsterm",
        "ExecStartPre=/usr/bin/tlsterm serve --check -c /etc/tlsterm/tlsterm.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "ProtectSystem=strict",
        "StateDirectory=tlsterm",
        "NoNewPrivileges=true",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "`{line}` missing from the unit:\n{unit}"
        );
    }
    // The packaged binary is this build's.
    let version = run(Command::new(tree.join("usr/bin/tlsterm")).arg("--version"));
    let ours = run(Command::new(TLSTERM).arg("--version"));
    assert_eq!(version.stdout, ours.stdout);
}

/// `dpkg -i` installs the package on this machine (only where TLSTERM_TEST_DPKG=1 says this
/// machine may be changed, as CI's throwaway ones are), then `dpkg --purge` removes it.
#[test]
fn debian_package_installs_and_purges() {
    if std::env::var("TLSTERM_TEST_DPKG").as_deref() != Ok("1") {
        eprintln!("skipped: set TLSTERM_TEST_DPKG=1 to let this test install a package (as root)");
        return;
    }
    let Some(package) = package() else {
        return;
    };
    /// Purges the package however the checks end.
    struct Purge;
    impl Drop for Purge {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["--purge", "tlsterm"]).status();
        }
    }
    let purge = Purge;
    run(Command::new("dpkg").arg("-i").arg(package));
    run(Command::new("id").arg("tlsterm"));
    run(Command::new("/usr/bin/tlsterm").args([
        "serve",
        "--check",
        "-c",
        "/etc/tlsterm/tlsterm.toml",
    ]));
    drop(purge);
    assert!(!Path::new("/usr/bin/tlsterm").exists());
}
