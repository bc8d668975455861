//! The page and its files, all embedded in the binary (nothing is fetched from elsewhere:
//! the page works offline and behind any firewall).
//!
//! Caching: every asset carries an `ETag` (a hash of its bytes) and is revalidated
//! (`Cache-Control: no-cache`), so a browser downloads it once per binary and then gets
//! `304 Not Modified`. The page links each asset with `?v=<its hash>`, and an asset asked
//! for with its current hash is `immutable` for a day, so a reload asks nothing at all.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash as _, Hasher as _};

use bytes::Bytes;
use vramctl_exporter::routes::{RouteBody, RouteRequest, RouteResponse};

use crate::reply::{Query, security_headers};

/// uPlot 1.6.32 (MIT, `assets/vendor/uplot/LICENSE`): the charts.
const UPLOT_JS: &str = include_str!("../assets/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/vendor/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../assets/vendor/uplot/LICENSE");
/// The page's shell: mode switch, helpers every mode uses.
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

struct Asset {
    bytes: Bytes,
    content_type: &'static str,
    etag: String,
}

/// The embedded files by path, and the page.
pub struct Assets {
    files: HashMap<String, Asset>,
    page: Asset,
}

fn hash_hex(bytes: &[u8]) -> String {
    // Not for security: an ETag only has to change when the bytes do.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

fn asset(text: &'static str, content_type: &'static str) -> Asset {
    Asset {
        etag: format!("\"{}\"", hash_hex(text.as_bytes())),
        bytes: Bytes::from_static(text.as_bytes()),
        content_type,
    }
}

impl Assets {
    /// The files, with `modes` (id, tab label, script) on the page in this order.
    pub fn new(modes: &[(&'static str, &'static str, &'static str)]) -> Self {
        let mut files = HashMap::new();
        let mut add = |path: String, text: &'static str, content_type: &'static str| {
            files.insert(path, asset(text, content_type));
        };
        add(
            "/assets/uPlot.iife.min.js".into(),
            UPLOT_JS,
            "text/javascript; charset=utf-8",
        );
        add(
            "/assets/uPlot.min.css".into(),
            UPLOT_CSS,
            "text/css; charset=utf-8",
        );
        add(
            "/assets/uPlot.LICENSE.txt".into(),
            UPLOT_LICENSE,
            "text/plain; charset=utf-8",
        );
        add(
            "/assets/app.js".into(),
            APP_JS,
            "text/javascript; charset=utf-8",
        );
        add("/assets/app.css".into(), APP_CSS, "text/css; charset=utf-8");
        for (name, _, script) in modes {
            add(
                format!("/assets/{name}.js"),
                script,
                "text/javascript; charset=utf-8",
            );
        }
        let page = page(&files, modes);
        Self {
            page: Asset {
                etag: format!("\"{}\"", hash_hex(page.as_bytes())),
                bytes: Bytes::from(page),
                content_type: "text/html; charset=utf-8",
            },
            files,
        }
    }

    /// The answer to a path under `/assets/`, or `/`.
    pub fn respond(&self, request: &RouteRequest) -> RouteResponse {
        let found = if request.path == "/" {
            Some(&self.page)
        } else {
            self.files.get(&request.path)
        };
        let Some(asset) = found else {
            return crate::Reply::error(404, "no such file").into_response();
        };
        let mut headers = security_headers();
        headers.push(("etag", asset.etag.clone()));
        let versioned = Query::parse(&request.query)
            .get("v")
            .is_some_and(|v| asset.etag.trim_matches('"') == v);
        headers.push((
            "cache-control",
            if versioned {
                "public, max-age=86400, immutable".to_owned()
            } else {
                "no-cache".to_owned()
            },
        ));
        let unchanged = request
            .if_none_match
            .as_deref()
            .is_some_and(|tags| tags.split(',').any(|t| t.trim() == asset.etag));
        if unchanged {
            return RouteResponse {
                status: 304,
                content_type: asset.content_type,
                headers,
                body: RouteBody::Full(Bytes::new()),
            };
        }
        RouteResponse {
            status: 200,
            content_type: asset.content_type,
            headers,
            body: RouteBody::Full(asset.bytes.clone()),
        }
    }
}

/// The page: a header with the mode tabs, one region per mode, the scripts. No inline
/// script or style (the CSP forbids both); every asset linked with its version.
fn page(files: &HashMap<String, Asset>, modes: &[(&str, &str, &str)]) -> String {
    let versioned = |path: &str| {
        let v = files
            .get(path)
            .map(|a| a.etag.trim_matches('"').to_owned())
            .unwrap_or_default();
        format!("{path}?v={v}")
    };
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>vramctl</title>\n<link rel=\"icon\" href=\"data:,\">\n\
         <link rel=\"stylesheet\" href=\"{}\">\n<link rel=\"stylesheet\" href=\"{}\">\n\
         </head>\n<body>\n<header class=\"top\">\n<h1>vramctl</h1>\n\
         <nav aria-label=\"Modes\"><div role=\"tablist\" id=\"modes\">\n",
        versioned("/assets/uPlot.min.css"),
        versioned("/assets/app.css"),
    );
    for (i, (name, title, _)) in modes.iter().enumerate() {
        let selected = i == 0;
        let _ = writeln!(
            html,
            "<button type=\"button\" role=\"tab\" id=\"tab-{name}\" data-mode=\"{name}\" \
             aria-controls=\"panel-{name}\" aria-selected=\"{selected}\" tabindex=\"{}\">{title}</button>",
            if selected { 0 } else { -1 },
        );
    }
    html.push_str(
        "</div></nav>\n<p id=\"status\" class=\"status\" role=\"status\" aria-live=\"polite\"></p>\n\
         </header>\n<main>\n",
    );
    for (i, (name, _, _)) in modes.iter().enumerate() {
        let _ = writeln!(
            html,
            "<section role=\"tabpanel\" id=\"panel-{name}\" aria-labelledby=\"tab-{name}\" \
             class=\"panel\"{}></section>",
            if i == 0 { "" } else { " hidden" },
        );
    }
    html.push_str("</main>\n<footer class=\"foot\">Read-only. Charts by uPlot (<a href=\"/assets/uPlot.LICENSE.txt\">MIT licence</a>).</footer>\n");
    let _ = writeln!(
        html,
        "<script src=\"{}\" defer></script>\n<script src=\"{}\" defer></script>",
        versioned("/assets/uPlot.iife.min.js"),
        versioned("/assets/app.js"),
    );
    for (name, _, _) in modes {
        let _ = writeln!(
            html,
            "<script src=\"{}\" defer></script>",
            versioned(&format!("/assets/{name}.js"))
        );
    }
    html.push_str("</body>\n</html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(assets: &Assets, path: &str, query: &str) -> RouteResponse {
        assets.respond(&RouteRequest {
            path: path.into(),
            query: query.into(),
            ..RouteRequest::default()
        })
    }

    fn header<'a>(response: &'a RouteResponse, name: &str) -> Option<&'a str> {
        response
            .headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_page_links_every_mode_and_versioned_assets_only() {
        let assets = Assets::new(&[("live", "Live", "1"), ("fleet", "Fleet", "2")]);
        let page = String::from_utf8_lossy(match &get(&assets, "/", "").body {
            RouteBody::Full(b) => b,
            RouteBody::Stream(_) => panic!("a page is whole"),
        })
        .into_owned();
        assert!(page.contains("data-mode=\"live\""));
        assert!(page.contains("/assets/fleet.js?v="));
        assert!(!page.contains("<script>"), "no inline script");
        assert!(!page.contains("style="), "no inline style");
        assert!(!page.contains("http://") && !page.contains("https://"));
        let js = get(&assets, "/assets/fleet.js", "");
        assert_eq!(js.status, 200);
        assert_eq!(js.content_type, "text/javascript; charset=utf-8");
        assert_eq!(header(&js, "cache-control"), Some("no-cache"));
        assert!(header(&js, "content-security-policy").is_some());
        assert_eq!(get(&assets, "/assets/nothing.js", "").status, 404);
    }

    #[test]
    fn an_unchanged_asset_is_not_sent_again() {
        let assets = Assets::new(&[]);
        let first = get(&assets, "/assets/app.js", "");
        let etag = header(&first, "etag").expect("an etag").to_owned();
        let again = assets.respond(&RouteRequest {
            path: "/assets/app.js".into(),
            if_none_match: Some(etag.clone()),
            ..RouteRequest::default()
        });
        assert_eq!(again.status, 304);
        let versioned = get(
            &assets,
            "/assets/app.js",
            &format!("v={}", etag.trim_matches('"')),
        );
        assert_eq!(
            header(&versioned, "cache-control"),
            Some("public, max-age=86400, immutable")
        );
    }
}
