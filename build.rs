//! Records the commit the binary is built from, for `tlsterm --version` (`unknown` outside a
//! git checkout, as in a source tarball).

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TLSTERM_COMMIT={commit}");
    // A new commit or checkout changes HEAD or the branch it names (a worktree has its own
    // HEAD; branches live in the common directory).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        println!("cargo:rerun-if-changed={common}/{branch}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
