//! Requests from Envoy's access logs in its default format:
//!
//! ```text
//! [%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"
//! ```
//!
//! The log does not say which descriptors Envoy sent, so the caller says how
//! to make one: a domain and its entries, each a key and where its value is
//! in the line ([`Source`]). Envoy sends no descriptor when a value is
//! missing (`-` in the log), so such a line is no rate limit request:
//! skipped, and counted.

use std::str::FromStr;

use tollgate_policy::{Descriptor, Entry};
use tollgate_server::serve::record::{RecordedRequest, parse_time};

/// Where an entry's value is in an access log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The client's address: the last address of `X-Forwarded-For`, the one
    /// Envoy's `remote_address` action takes by default (no trusted hops;
    /// with `use_remote_address` Envoy appends the peer's address).
    Client,
    /// The request's path.
    Path,
    /// The request's method.
    Method,
    /// One of the headers the format logs.
    Header(Header),
}

/// The request headers Envoy's default format logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    XForwardedFor,
    UserAgent,
    XRequestId,
    Authority,
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "client" => Source::Client,
            "path" => Source::Path,
            "method" => Source::Method,
            _ => {
                let name = s.strip_prefix("header:").ok_or_else(|| {
                    format!(
                        "unknown value source {s:?}; expected client, path, method or header:NAME"
                    )
                })?;
                Source::Header(match name.to_ascii_lowercase().as_str() {
                    "x-forwarded-for" => Header::XForwardedFor,
                    "user-agent" => Header::UserAgent,
                    "x-request-id" => Header::XRequestId,
                    ":authority" | "host" => Header::Authority,
                    _ => {
                        return Err(format!(
                            "Envoy's default access log format does not log header {name:?}; it logs x-forwarded-for, user-agent, x-request-id and :authority"
                        ));
                    }
                })
            }
        })
    }
}

/// One descriptor entry to make: `KEY=SOURCE` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntrySpec {
    key: String,
    source: Source,
}

impl FromStr for EntrySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (key, source) = s
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| format!("expected KEY=SOURCE, e.g. remote_address=client; got {s:?}"))?;
        Ok(Self {
            key: key.to_owned(),
            source: source.parse()?,
        })
    }
}

/// How to turn access log lines into requests: one descriptor of `entries`
/// in `domain`, costing 1.
#[derive(Debug, Clone)]
pub(crate) struct AccessLog {
    pub(crate) domain: String,
    pub(crate) entries: Vec<EntrySpec>,
}

/// The fields of a line, as the default format writes them.
struct Fields<'a> {
    start_time: &'a str,
    method: &'a str,
    path: &'a str,
    forwarded_for: &'a str,
    user_agent: &'a str,
    request_id: &'a str,
    authority: &'a str,
}

impl AccessLog {
    /// The request a line stands for, or `None` when a value the descriptor
    /// needs is missing.
    pub(crate) fn request(&self, line: &str) -> Result<Option<RecordedRequest>, String> {
        let fields = fields(line)?;
        let at = parse_time(fields.start_time)?;
        let mut entries = Vec::with_capacity(self.entries.len());
        for spec in &self.entries {
            let value = match spec.source {
                Source::Client => fields
                    .forwarded_for
                    .rsplit(',')
                    .next()
                    .unwrap_or_default()
                    .trim(),
                Source::Path => fields.path,
                Source::Method => fields.method,
                Source::Header(Header::XForwardedFor) => fields.forwarded_for,
                Source::Header(Header::UserAgent) => fields.user_agent,
                Source::Header(Header::XRequestId) => fields.request_id,
                Source::Header(Header::Authority) => fields.authority,
            };
            if value.is_empty() || value == "-" {
                return Ok(None);
            }
            entries.push(Entry::new(&spec.key, value));
        }
        Ok(Some(RecordedRequest {
            at,
            domain: self.domain.clone(),
            descriptors: vec![Descriptor {
                entries,
                ..Descriptor::default()
            }],
            hits_addend: 1,
        }))
    }
}

/// Splits a line of the default format into its fields: `[time]`, a quoted
/// request line, six bare fields and five quoted ones. A quoted field ends at
/// the first `"` followed by a space or the end of the line (Envoy does not
/// escape quotes in values).
fn fields(line: &str) -> Result<Fields<'_>, String> {
    const SHAPE: &str = "expected Envoy's default access log format: [START_TIME] \"METHOD PATH PROTOCOL\" CODE FLAGS RECEIVED SENT DURATION UPSTREAM_TIME \"X-FORWARDED-FOR\" \"USER-AGENT\" \"X-REQUEST-ID\" \"AUTHORITY\" \"UPSTREAM_HOST\"";
    let rest = line.strip_prefix('[').ok_or(SHAPE)?;
    let (start_time, mut rest) = rest.split_once("] ").ok_or(SHAPE)?;
    let mut parts = Vec::with_capacity(12);
    while !rest.is_empty() {
        let (field, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted
                .match_indices('"')
                .map(|(i, _)| i)
                .find(|&i| matches!(quoted.as_bytes().get(i + 1), None | Some(b' ')))
                .ok_or(SHAPE)?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            rest.split_once(' ').unwrap_or((rest, ""))
        };
        parts.push(field);
        rest = after.strip_prefix(' ').unwrap_or(after);
    }
    let [
        request,
        _,
        _,
        _,
        _,
        _,
        _,
        forwarded_for,
        user_agent,
        request_id,
        authority,
        _,
    ] = parts[..]
    else {
        return Err(format!(
            "{SHAPE}; found {} fields after the time, not 12",
            parts.len()
        ));
    };
    let mut request = request.split(' ');
    let (Some(method), Some(path), Some(_protocol), None) = (
        request.next(),
        request.next(),
        request.next(),
        request.next(),
    ) else {
        return Err(format!(
            "the request field {request:?} is not \"METHOD PATH PROTOCOL\"",
            request = parts[0]
        ));
    };
    Ok(Fields {
        start_time,
        method,
        path,
        forwarded_for,
        user_agent,
        request_id,
        authority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"[2026-11-24T10:00:00.250Z] "GET /api/items?page=2 HTTP/1.1" 200 - 0 512 3 2 "203.0.113.9, 10.0.0.2" "curl/8.5.0 (x86_64) \"quoted\"" "5f0c-41" "api.example.com" "10.1.2.3:8080""#;

    fn log(entries: &[&str]) -> AccessLog {
        AccessLog {
            domain: "edge".into(),
            entries: entries.iter().map(|e| e.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn each_source_reads_its_field() {
        let request = log(&[
            "remote_address=client",
            "path=path",
            "method=method",
            "ua=header:User-Agent",
            "id=header:x-request-id",
            "host=header::authority",
            "xff=header:x-forwarded-for",
        ])
        .request(LINE)
        .unwrap()
        .unwrap();
        assert_eq!(request.at, 1_795_514_400_250_000_000);
        assert_eq!(request.domain, "edge");
        let values: Vec<&str> = request.descriptors[0]
            .entries
            .iter()
            .map(|e| e.value.as_str())
            .collect();
        assert_eq!(
            values,
            [
                "10.0.0.2",
                "/api/items?page=2",
                "GET",
                r#"curl/8.5.0 (x86_64) \"quoted\""#,
                "5f0c-41",
                "api.example.com",
                "203.0.113.9, 10.0.0.2",
            ]
        );
    }

    #[test]
    fn a_missing_value_makes_no_request() {
        let line = LINE.replace("\"5f0c-41\"", "\"-\"");
        assert_eq!(log(&["id=header:x-request-id"]).request(&line), Ok(None));
    }

    #[test]
    fn bad_lines_and_specs_are_refused() {
        let log = log(&["remote_address=client"]);
        assert!(
            log.request("GET /")
                .unwrap_err()
                .contains("default access log format")
        );
        assert!(
            log.request(&LINE.replace(" \"10.1.2.3:8080\"", ""))
                .unwrap_err()
                .contains("11 fields")
        );
        assert!(
            log.request(&LINE.replace("2026-11-24T10", "2026-11-24 10:"))
                .unwrap_err()
                .contains("RFC 3339")
        );
        assert!("user".parse::<EntrySpec>().is_err());
        assert!("=client".parse::<EntrySpec>().is_err());
        assert!(
            "user=header:x-user-id"
                .parse::<EntrySpec>()
                .unwrap_err()
                .contains("does not log")
        );
        assert!("user=cookie".parse::<EntrySpec>().is_err());
    }
}
