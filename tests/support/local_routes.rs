//! The invented address ranges of the tests must fail locally (tests/env/local-routes.sh): checked before
//! anything that could send to an invented address starts, and the run stops loudly if a route is missing.

use std::{process::Command, sync::OnceLock};

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/env/local-routes.sh")
}

/// Panics unless every invented range has its `unreachable` route (`scripts/test.sh` installs them).
pub fn require() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = CHECKED.get_or_init(|| {
        let out = Command::new("bash")
            .arg(script())
            .arg("check")
            .output()
            .map_err(|e| format!("running local-routes.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(why) = outcome {
        panic!("the test address ranges are not kept local; refusing to run.\n{why}");
    }
}

/// The invented ranges, as the script lists them.
pub fn ranges() -> Vec<String> {
    let out = Command::new("bash")
        .arg(script())
        .arg("ranges")
        .output()
        .expect("list the test ranges");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
