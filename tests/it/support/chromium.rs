//! A headless Chromium (Debian's `chromium`) for the tests that look at pages in a browser,
//! driven over the DevTools protocol: a throw-away profile, a tab, commands and the events they
//! raise, script evaluation, screenshots of the window or the whole page, and the page's errors.

use crate::web::eventually;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;
use tungstenite::{Message, WebSocket};

/// The window's size; a whole-page screenshot extends it down to the page's end.
const WINDOW: (u32, u32) = (1280, 1000);

/// A headless Chromium with its own throw-away profile; closed (or killed) when dropped.
pub(crate) struct Chromium {
    child: Child,
    profile: TempDir,
    port: u16,
    /// The browser-wide DevTools connection, once a page was opened through it.
    browser: Option<Cdp>,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // Asked to close, Chromium takes its helper processes with it; kill only if it won't.
        if let Some(browser) = &mut self.browser {
            let close = json!({ "id": 0, "method": "Browser.close" });
            let _ = browser.socket.send(Message::text(close.to_string()));
        }
        let closed = eventually(Duration::from_secs(5), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !closed {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Chromium {
    pub(crate) fn start() -> Chromium {
        let profile = tempfile::Builder::new()
            .prefix("gpumem-chromium-")
            .tempdir()
            .expect("temp dir");
        let log = std::fs::File::create(profile.path().join("chromium.log")).expect("log file");
        let child = Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .args([
                "--disable-background-networking",
                "--disable-component-update",
            ])
            .args([
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
            ])
            .args([
                "--hide-scrollbars",
                "--mute-audio",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("chromium runs");
        let mut browser = Chromium {
            child,
            profile,
            port: 0,
            browser: None,
        };
        // Chromium writes the port it picked, then the browser's DevTools path, to this file.
        let port_file = browser.profile.path().join("DevToolsActivePort");
        let started = eventually(Duration::from_secs(30), || {
            let text = std::fs::read_to_string(&port_file).unwrap_or_default();
            browser.port = text
                .lines()
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            browser.port != 0
        });
        assert!(
            started,
            "chromium did not open DevTools:\n{}",
            browser.log()
        );
        browser
    }

    /// Chromium's log, less its complaints about the missing D-Bus.
    pub(crate) fn log(&self) -> String {
        let log = std::fs::read_to_string(self.profile.path().join("chromium.log"));
        let log = log.unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains("dbus")).collect();
        lines.join("\n")
    }

    /// A DevTools connection to a new tab (opened through the browser's own endpoint, whose
    /// path Chromium writes after the port).
    pub(crate) fn page(&mut self) -> Cdp {
        let active = std::fs::read_to_string(self.profile.path().join("DevToolsActivePort"))
            .expect("DevToolsActivePort");
        let path = active.lines().nth(1).expect("the browser's DevTools path");
        let mut browser = Cdp::connect(&format!("ws://127.0.0.1:{}{path}", self.port));
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let id = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        self.browser = Some(browser);
        Cdp::connect(&format!("ws://127.0.0.1:{}/devtools/page/{id}", self.port))
    }
}

/// A DevTools-protocol client: commands in order, events kept for later.
pub(crate) struct Cdp {
    socket: WebSocket<TcpStream>,
    next_id: u64,
    events: Vec<Value>,
}

impl Cdp {
    fn connect(url: &str) -> Cdp {
        let host = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("unexpected DevTools URL {url}"));
        let stream = TcpStream::connect(host).expect("connect to DevTools");
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("read timeout");
        let (socket, _) = tungstenite::client(url, stream)
            .unwrap_or_else(|e| panic!("DevTools handshake with {url} failed: {e}"));
        Cdp {
            socket,
            next_id: 1,
            events: Vec::new(),
        }
    }

    /// Sends one command and returns its result; events that arrive meanwhile are kept.
    pub(crate) fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let command = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(command.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let message = match self.socket.read() {
                Ok(message) => message,
                // A socket with a read timeout returns EINTR when any signal handler runs in
                // the process (socket(7)), whatever SA_RESTART says: nothing was read, read on.
                Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                    continue
                }
                Err(e) => panic!("{method}: no answer: {e}"),
            };
            let Ok(text) = message.to_text() else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if value["id"] == id {
                assert!(value.get("error").is_none(), "{method}: {}", value["error"]);
                return value["result"].clone();
            }
            if value.get("method").is_some() {
                self.events.push(value);
            }
        }
    }

    pub(crate) fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        result["result"]["value"].clone()
    }

    /// A PNG of the window, or of the whole page.
    pub(crate) fn screenshot(&mut self, whole_page: bool) -> Vec<u8> {
        let mut params = json!({ "format": "png" });
        if whole_page {
            let metrics = self.call("Page.getLayoutMetrics", json!({}));
            let size = &metrics["cssContentSize"];
            params["captureBeyondViewport"] = json!(true);
            params["clip"] = json!({
                "x": 0, "y": 0, "scale": 1,
                "width": size["width"].as_f64().unwrap_or(f64::from(WINDOW.0)),
                "height": size["height"].as_f64().unwrap_or(f64::from(WINDOW.1)),
            });
        }
        let shot = self.call("Page.captureScreenshot", params);
        let data = shot["data"].as_str().expect("screenshot data");
        data_encoding::BASE64
            .decode(data.as_bytes())
            .expect("screenshot is base64")
    }

    /// Uncaught exceptions, console errors and failed loads seen so far.
    pub(crate) fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|event| {
                let params = &event["params"];
                match event["method"].as_str()? {
                    "Runtime.exceptionThrown" => {
                        let details = &params["exceptionDetails"];
                        Some(format!(
                            "uncaught: {} {}",
                            details["text"], details["exception"]["description"]
                        ))
                    }
                    "Runtime.consoleAPICalled"
                        if matches!(params["type"].as_str(), Some("error" | "assert")) =>
                    {
                        Some(format!("console.{}: {}", params["type"], params["args"]))
                    }
                    "Log.entryAdded" if params["entry"]["level"] == "error" => {
                        let entry = &params["entry"];
                        Some(format!(
                            "{}: {} {}",
                            entry["source"], entry["text"], entry["url"]
                        ))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}
