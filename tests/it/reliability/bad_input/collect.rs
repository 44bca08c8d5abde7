//! The files a sidecar collects: `gpumem serve --collect-dir` over a directory of bad and
//! hostile files keeps serving and reads only what it should.

use crate::reliability::{gpumem, Scratch};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `gpumem serve --collect-dir` over a directory of bad files (empty, not JSON, cut short, a
/// newer or another format, too large, too many devices, binary garbage, a directory, a FIFO,
/// symlinks to a secret and to a valid file outside) and one good file with a hostile process
/// name: it keeps sampling, rejects each bad file, never reads through a link or blocks on the
/// FIFO, exports the good one with its name cleaned, and escapes it on the page.
#[test]
fn a_collect_directory_of_bad_files_is_survived() {
    let dir = Scratch::new("collect");
    let outside = Scratch::new("collect-outside");
    let template: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../fuzz/corpus/published_file/valid-demo.json"
    ))
    .expect("the corpus's valid file");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let file_with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut file = template.clone();
        file["pid"] = std::process::id().into();
        file["timestamp_seconds"] = now.into();
        file["interval_seconds"] = 60.0.into();
        edit(&mut file);
        serde_json::to_vec(&file).expect("encode")
    };
    let good = file_with(&|f| f["process"] = "evil\n<script>alert(1)</script>".into());
    dir.file("gpumem-1000001.json", &good);
    dir.file("gpumem-1000002.json", b"");
    dir.file("gpumem-1000003.json", b"hello, world");
    dir.file("gpumem-1000004.json", &good[..good.len() / 2]);
    dir.file(
        "gpumem-1000005.json",
        &file_with(&|f| f["version"] = 99.into()),
    );
    dir.file(
        "gpumem-1000006.json",
        &file_with(&|f| f["format"] = "other".into()),
    );
    dir.file("gpumem-1000007.json", &vec![b' '; 5 << 20]);
    dir.file(
        "gpumem-1000008.json",
        &file_with(&|f| {
            let device = f["devices"][0].clone();
            f["devices"] = (0..65)
                .map(|gpu| {
                    let mut d = device.clone();
                    d["gpu"] = gpu.into();
                    d
                })
                .collect::<Vec<_>>()
                .into();
        }),
    );
    dir.file("gpumem-1000009.json", b"\x00\xff\xfe{{{\x9c");
    std::fs::create_dir(dir.path().join("gpumem-1000010.json")).expect("mkdir");
    let fifo = dir.path().join("gpumem-1000011.json");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let secret = "root:x:0:0:secret-marker";
    let secret_path = outside.file("passwd", secret.as_bytes());
    let smuggled = outside.file(
        "smuggled.json",
        &file_with(&|f| f["process"] = "smuggled-through-a-link".into()),
    );
    std::os::unix::fs::symlink(&secret_path, dir.path().join("gpumem-1000012.json")).unwrap();
    std::os::unix::fs::symlink(&smuggled, dir.path().join("gpumem-1000013.json")).unwrap();

    let mut serve = gpumem()
        .args(["serve", "--backend", "sim", "--listen", "127.0.0.1:0"])
        .args(["--interval", "200ms", "--collect-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpumem serve starts");
    let stdout = serve.stdout.take().expect("stdout");
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    let addr: Option<std::net::SocketAddr> = line
        .trim()
        .strip_prefix("gpumem serve: open http://")
        .and_then(|rest| rest.trim_end_matches('/').parse().ok());
    let outcome = std::panic::catch_unwind(|| {
        let addr = addr.unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        let metrics = || crate::web::get(addr, "/metrics").body;
        let samples =
            |text: &str| crate::web::value_of(text, "gpumem_samples_total", "").unwrap_or(0.0);
        assert!(
            crate::web::eventually(Duration::from_secs(10), || metrics().contains("smuggled")
                || metrics().contains("evil")),
            "the good file is never collected"
        );
        let first = metrics();
        std::thread::sleep(Duration::from_millis(800));
        let text = metrics();
        assert!(
            samples(&text) > samples(&first),
            "sampling stopped (the FIFO?)"
        );
        assert_eq!(crate::web::get(addr, "/healthz").status, 200);
        assert!(
            text.contains("process=\"evil_<script>alert(1)</script>\""),
            "{text}"
        );
        assert!(!text.contains("smuggled"), "a symlinked file was read");
        let rejected: f64 = text
            .lines()
            .filter(|l| l.starts_with("gpumem_collect_rejected_files{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert!(rejected >= 8.0, "only {rejected} files rejected:\n{text}");
        for path in ["/", "/api/v1/snapshot", "/metrics"] {
            let body = crate::web::get(addr, path).body;
            assert!(
                !body.contains("secret-marker"),
                "{path} shows a linked file"
            );
        }
        let page = crate::web::get(addr, "/").body;
        assert!(
            !page.contains("<script>alert(1)"),
            "the page does not escape names"
        );
    });
    let alive = serve.try_wait().expect("wait").is_none();
    let _ = serve.kill();
    let _ = serve.wait();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert!(alive, "gpumem serve died");
}
