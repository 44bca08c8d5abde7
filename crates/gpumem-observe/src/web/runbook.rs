//! `GET /runbook`: `docs/runbook.md`, compiled in and served as a plain HTML page whose section
//! anchors are the alerts' names (`#gpumemoutofmemory`), so the status page's hints and the
//! alerts' `runbook_url` have an absolute link that works wherever gpumem runs, offline too.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::sync::OnceLock;

// `runbook.md` in the crate is a link to docs/runbook.md: through it the file is inside the
// package, so a source distribution of the crate (the Python package's sdist) carries it.
const RUNBOOK: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/runbook.md"));

pub async fn serve() -> Response {
    static PAGE: OnceLock<String> = OnceLock::new();
    let page = PAGE.get_or_init(|| render(RUNBOOK));
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        page.as_str(),
    )
        .into_response()
}

/// The anchor a heading gets, as GitHub makes it: lowercase, spaces to `-`, punctuation dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Headings become linkable `<h1>`/`<h2>`/`<h3>`; everything between them is kept as written
/// (pre-wrapped), which reads well for a runbook of short paragraphs and lists.
fn render(markdown: &str) -> String {
    let mut html = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>gpumem runbook</title><link rel=\"stylesheet\" href=\"/static/style.css\"></head>\
         <body><main class=\"runbook\"><p><a href=\"/\">← status page</a></p>\n",
    );
    let mut block = String::new();
    let flush = |block: &mut String, html: &mut String| {
        if !block.trim().is_empty() {
            html.push_str(&format!(
                "<pre class=\"md\">{}</pre>\n",
                escape(block.trim())
            ));
        }
        block.clear();
    };
    for line in markdown.lines().filter(|l| !l.starts_with("<!--")) {
        let level = line.chars().take_while(|&c| c == '#').count();
        if (1..=3).contains(&level) && line[level..].starts_with(' ') {
            flush(&mut block, &mut html);
            let title = line[level..].trim();
            html.push_str(&format!(
                "<h{level} id=\"{}\">{}</h{level}>\n",
                anchor(title),
                escape(title)
            ));
        } else {
            block.push_str(line);
            block.push('\n');
        }
    }
    flush(&mut block, &mut html);
    html.push_str("</main></body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alert_section_has_its_anchor() {
        let page = render(RUNBOOK);
        for id in [
            "gpumemoutofmemory",
            "gpumempressurecritical",
            "gpumemsamplingfailing",
        ] {
            assert!(page.contains(&format!("id=\"{id}\"")), "{id} missing");
        }
        assert_eq!(anchor("The OOM flight recorder"), "the-oom-flight-recorder");
        assert!(!page.contains("<script"), "markdown is escaped");
    }
}
