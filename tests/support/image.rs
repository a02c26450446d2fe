//! The container image without a container runtime: the static binary `scripts/image.sh` builds (the Dockerfile's
//! build stage runs the same script), in a root holding only what the image's base (distroless/static) and the
//! kubelet put there, run by `tests/env/image-root.sh` as the Deployment's securityContext runs it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
};

use super::cluster::repo;

/// User and group of distroless's `nonroot`, and of the Deployment's `runAsUser`.
pub const NONROOT: u32 = 65532;

/// The kubelet's mount of a Pod's ServiceAccount (the in-cluster configuration reads it).
pub const SERVICE_ACCOUNT: &str = "var/run/secrets/kubernetes.io/serviceaccount";

/// The static binary, built once per test binary (debug: linking is what this checks, not speed). Its own
/// target directory under this build's, so it never waits on the `cargo test` that runs it.
pub fn static_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = Path::new(env!("CARGO_BIN_EXE_rayshift"))
            .ancestors()
            .nth(2)
            .expect("target directory")
            .to_path_buf();
        let out = Command::new("bash")
            .arg(repo().join("scripts/image.sh"))
            .arg("binary")
            .env("CARGO_TARGET_DIR", target)
            .output()
            .expect("run scripts/image.sh");
        assert!(
            out.status.success(),
            "scripts/image.sh binary failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Whether an ELF file names a program interpreter (PT_INTERP): a dynamically linked program does, and cannot
/// start in a root without that loader and its libraries.
pub fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (usize::from(u16_at(0x36)), usize::from(u16_at(0x38)));
    (0..count).any(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
    })
}

/// A root filesystem as the running image sees it: distroless/static's files (the CA bundle, the nonroot user),
/// `/rayshift`, the kubelet's /etc/hosts and mount points, and whatever the test mounts (`put`).
pub struct ImageRoot {
    dir: tempfile::TempDir,
}

impl ImageRoot {
    pub fn new(hosts: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = Self { dir };
        std::fs::copy(static_binary(), root.path().join("rayshift")).unwrap();
        root.put(
            "etc/ssl/certs/ca-certificates.crt",
            &std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap(),
        );
        root.put("etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n");
        root.put("etc/group", b"root:x:0:\nnonroot:x:65532:\n");
        root.put("etc/hosts", format!("127.0.0.1\tlocalhost\n{hosts}").as_bytes());
        for node in ["null", "zero", "full", "random", "urandom"] {
            root.put(&format!("dev/{node}"), b"");
        }
        std::fs::create_dir_all(root.path().join("proc")).unwrap();
        root
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A file readable by every user (a Secret volume's default mode, 0644), its directories 0755.
    pub fn put(&self, path: &str, content: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let file = self.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        for dir in file.ancestors().skip(1) {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            if dir == self.path() {
                break;
            }
        }
    }

    /// `/rayshift ARGS` in this root with only `env` (a container's environment; PATH is kept for the launcher),
    /// stderr piped.
    pub fn spawn(&self, args: &[String], env: &[(&str, String)]) -> Child {
        Command::new("bash")
            .arg(repo().join("tests/env/image-root.sh"))
            .arg("run")
            .arg(self.path())
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rayshift in its image root")
    }
}
