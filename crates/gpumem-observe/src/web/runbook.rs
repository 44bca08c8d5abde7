//! `GET /runbook`: `docs/runbook.md`, compiled in and rendered to HTML (CommonMark with tables)
//! whose section anchors are the alerts' names (`#gpumemoutofmemory`), as GitHub makes them: the
//! status page's hints link here, offline too, and the alerts' default links to the same
//! sections of the repository's copy.

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

/// The runbook as a page: headings get GitHub's anchors, and HTML written in the markdown is
/// shown as text, never passed through (the page sends a strict content policy; a stray tag in
/// a doc must not be able to run anything).
fn render(markdown: &str) -> String {
    use pulldown_cmark::{html, Event, Options, Parser, Tag, TagEnd};
    let mut page = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>gpumem runbook</title><link rel=\"stylesheet\" href=\"/static/style.css\"></head>\
         <body><main class=\"runbook\"><p><a href=\"/\">← status page</a></p>\n",
    );
    let mut events = Vec::new();
    let mut heading: Option<(pulldown_cmark::HeadingLevel, Vec<Event<'_>>)> = None;
    for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
        let event = match event {
            Event::Html(raw) | Event::InlineHtml(raw) => Event::Text(raw),
            other => other,
        };
        match (event, &mut heading) {
            (Event::Start(Tag::Heading { level, .. }), None) => heading = Some((level, Vec::new())),
            (Event::End(TagEnd::Heading(_)), Some(_)) => {
                let Some((level, inner)) = heading.take() else {
                    continue;
                };
                let title: String = inner
                    .iter()
                    .filter_map(|e| match e {
                        Event::Text(t) | Event::Code(t) => Some(t.as_ref()),
                        _ => None,
                    })
                    .collect();
                let mut inner_html = String::new();
                html::push_html(&mut inner_html, inner.into_iter());
                events.push(Event::Html(
                    format!(
                        "<{level} id=\"{}\">{inner_html}</{level}>\n",
                        anchor(&title)
                    )
                    .into(),
                ));
            }
            (event, Some((_, inner))) => inner.push(event),
            (event, None) => events.push(event),
        }
    }
    html::push_html(&mut page, events.into_iter());
    page.push_str("</main></body></html>\n");
    page
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
        assert!(
            !page.contains("<pre class=\"md\">"),
            "rendered, not pre-wrapped"
        );
        assert!(
            page.contains("<ul>") && page.contains("<code>"),
            "lists and code"
        );
    }

    #[test]
    fn html_in_the_markdown_is_shown_as_text() {
        let page = render("# Title `x`\n\nA <script>alert(1)</script> and <b>bold</b>.\n");
        assert!(
            page.contains("<h1 id=\"title-x\">Title <code>x</code></h1>"),
            "{page}"
        );
        assert!(
            !page.contains("<script>") && !page.contains("<b>"),
            "{page}"
        );
        assert!(page.contains("&lt;script&gt;"), "{page}");
    }
}
