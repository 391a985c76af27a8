//! Pages as a person sees them: headless Chromium (Debian's `chromium`, or `GPUVAL_CHROMIUM`)
//! loads a page, its DOM after load is read back, any console error fails the test, and a
//! screenshot goes to `target/screenshots/`. Without Chromium a test says so and passes, unless
//! `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::crds::repo_root;

/// Put first in `<head>`: every uncaught error, rejected promise and `console.error` is written
/// into `#console-errors`, which `--dump-dom` then shows.
pub const CAPTURE: &str = r#"<script>(function(){var e=[];function k(m){e.push(String(m));var p=document.getElementById('console-errors');if(p)p.textContent=e.join('\n');}window.addEventListener('error',function(x){k(x.message||'resource failed: '+(x.target&&(x.target.src||x.target.href)));},true);window.addEventListener('unhandledrejection',function(x){k(x.reason);});var c=console.error;console.error=function(){k(Array.prototype.join.call(arguments,' '));c.apply(console,arguments);};document.addEventListener('DOMContentLoaded',function(){var p=document.createElement('pre');p.id='console-errors';p.textContent=e.join('\n');document.body.appendChild(p);});})();</script>"#;

/// Chromium's path, if this machine has it (None: the caller skips, said on stderr; a panic
/// where `CI` is set).
pub fn chromium() -> Option<PathBuf> {
    let names = ["chromium", "chromium-browser", "google-chrome"];
    let found = std::env::var_os("GPUVAL_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(names.iter().filter_map(|n| {
            let out = Command::new("sh")
                .args(["-c", &format!("command -v {n}")])
                .output()
                .ok()?;
            let p = String::from_utf8(out.stdout).ok()?;
            (!p.trim().is_empty()).then(|| PathBuf::from(p.trim()))
        }))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and Chromium is missing: install Debian's `chromium` (.ci/run does)"
        );
        eprintln!("SKIPPED: no Chromium (apt-get install chromium, or GPUVAL_CHROMIUM=PATH)");
    }
    found
}

/// Where pages and screenshots go: `target/screenshots/`.
pub fn out_dir() -> PathBuf {
    let dir = repo_root().join("target").join("screenshots");
    std::fs::create_dir_all(&dir).expect("target/screenshots");
    dir
}

/// Runs headless Chromium on `page` with `extra` arguments; its stdout.
pub fn headless(chrome: &Path, page: &Path, extra: &[String]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--allow-file-access-from-files",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {stderr}");
    assert!(
        !stderr.contains("CONSOLE") || !stderr.contains("Uncaught"),
        "console error on {}: {stderr}",
        page.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes the page (and a copy with the console capture), screenshots it to `shot`, and
/// returns the DOM after load. Fails on any console error.
pub fn open(chrome: &Path, html: &str, name: &str, height: u32) -> String {
    let dir = out_dir();
    let page = dir.join(format!("{name}.html"));
    std::fs::write(&page, html).expect("write page");
    let probed = dir.join(format!("{name}.probe.html"));
    std::fs::write(
        &probed,
        html.replacen("<head>", &format!("<head>{CAPTURE}"), 1),
    )
    .expect("write probe");
    let dom = headless(chrome, &probed, &["--dump-dom".into()]);
    let errors = dom
        .split("<pre id=\"console-errors\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .expect("the capture ran (its <pre> is in the DOM)");
    assert_eq!(errors, "", "console errors on {name}");
    let shot = dir.join(format!("{name}.png"));
    headless(
        chrome,
        &page,
        &[
            format!("--screenshot={}", shot.display()),
            format!("--window-size=1400,{height}"),
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} is a real picture",
        shot.display()
    );
    dom
}
