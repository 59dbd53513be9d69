//! The ad-hoc check's body read by a scanner of its one shape, for the
//! check clients send on every request: serde_json's derived reader spent
//! about 3,400 instructions a check (field matching, `deny_unknown_fields`,
//! the generic visitor), a tenth of the server's work per check; the
//! scanner costs about 2,200.
//!
//! It takes only a plain subset of JSON: the six known fields, each at most
//! once, strings without escapes, unsigned integers in plain digits. It says
//! `None` for anything else (a `null`, an escape, a float, an unknown or
//! repeated field, a malformed body), and the caller then asks serde_json,
//! which gives the same answer or names the error. Every body it reads,
//! serde_json reads to the same values (the tests hold them equal).

use std::borrow::Cow;

use super::AdHocCheckRef;

/// The ad-hoc check in `body`, or `None` when it is not in the plain subset.
pub(super) fn adhoc(body: &[u8]) -> Option<AdHocCheckRef<'_>> {
    let mut scan = Scanner { body, at: 0 };
    let (mut key, mut limit, mut period) = (None, None, None);
    let (mut burst, mut algorithm, mut cost) = (None, None, None);
    scan.byte(b'{')?;
    if !scan.eat(b'}') {
        loop {
            let name = scan.string()?;
            scan.byte(b':')?;
            // A field given twice is left to serde_json, which refuses it.
            match name {
                "key" if key.is_none() => key = Some(scan.string()?),
                "limit" if limit.is_none() => limit = Some(scan.integer()?),
                "period" if period.is_none() => period = Some(scan.string()?),
                "burst" if burst.is_none() => burst = Some(scan.integer()?),
                "algorithm" if algorithm.is_none() => algorithm = Some(scan.string()?),
                "cost" if cost.is_none() => cost = Some(scan.integer()?),
                _ => return None,
            }
            if scan.eat(b'}') {
                break;
            }
            scan.byte(b',')?;
        }
    }
    scan.skip_space();
    if scan.at != body.len() {
        return None;
    }
    Some(AdHocCheckRef {
        key: Cow::Borrowed(key?),
        limit: limit?,
        period: Cow::Borrowed(period?),
        burst,
        algorithm,
        cost: cost.unwrap_or(1),
    })
}

struct Scanner<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    /// Skips JSON's whitespace.
    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.body.get(self.at) {
            self.at += 1;
        }
    }

    /// Whether `byte` comes next (after whitespace); if so, takes it.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_space();
        let next = self.body.get(self.at) == Some(&byte);
        self.at += usize::from(next);
        next
    }

    fn byte(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// A string without escapes or control characters, in valid UTF-8.
    fn string(&mut self) -> Option<&'a str> {
        self.byte(b'"')?;
        let rest = &self.body[self.at..];
        let length = rest
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if rest[length] != b'"' {
            return None;
        }
        self.at += length + 1;
        std::str::from_utf8(&rest[..length]).ok()
    }

    /// An unsigned integer in plain digits (no sign, fraction, exponent or
    /// leading zero), within `u64`.
    fn integer(&mut self) -> Option<u64> {
        self.skip_space();
        let rest = &self.body[self.at..];
        let length = rest
            .iter()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(rest.len());
        let digits = &rest[..length];
        if digits.is_empty() || (digits.len() > 1 && digits[0] == b'0') {
            return None;
        }
        // What follows must end the number: a fraction or an exponent would
        // make it a float, which serde_json refuses for an integer field.
        if let Some(b'.' | b'e' | b'E') = rest.get(length) {
            return None;
        }
        let mut n: u64 = 0;
        for &digit in digits {
            n = n.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        }
        self.at += length;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json reads from `body` as the fast path's struct, as
    /// comparable values.
    fn serde(body: &[u8]) -> Option<String> {
        serde_json::from_slice::<AdHocCheckRef<'_>>(body)
            .ok()
            .map(|c| format!("{c:?}"))
    }

    fn ours(body: &[u8]) -> Option<String> {
        adhoc(body).map(|c| format!("{c:?}"))
    }

    /// Every body the scanner reads, serde_json reads to the same values;
    /// the plain bodies clients send, the scanner reads.
    #[test]
    fn reads_what_serde_json_reads_or_leaves_it_to_serde_json() {
        let plain = [
            r#"{"key":"k","limit":10,"period":"1s"}"#,
            r#"{"key": "user:42", "limit": 1000, "period": "1s", "burst": 1000, "algorithm": "gcra", "cost": 1}"#,
            "{\n\t\"cost\" : 0 ,\r\n \"period\":\"1m\",\"limit\":18446744073709551615,\"key\":\"caf\u{e9} \u{7f}\"}  ",
            r#"{"algorithm":"sliding_window","key":"a","period":"10s","limit":0,"burst":0}"#,
        ];
        for body in plain {
            assert!(ours(body.as_bytes()).is_some(), "{body}");
            assert_eq!(ours(body.as_bytes()), serde(body.as_bytes()), "{body}");
        }
        let others = [
            r#"{"key":"k","limit":10}"#,
            r#"{"key":"k\"q","limit":10,"period":"1s"}"#,
            r#"{"key":"k","limit":10,"period":"1s","burst":null}"#,
            r#"{"key":"k","limit":10.0,"period":"1s"}"#,
            r#"{"key":"k","limit":1e3,"period":"1s"}"#,
            r#"{"key":"k","limit":-1,"period":"1s"}"#,
            r#"{"key":"k","limit":010,"period":"1s"}"#,
            r#"{"key":"k","limit":18446744073709551616,"period":"1s"}"#,
            r#"{"key":"k","key":"j","limit":10,"period":"1s"}"#,
            r#"{"key":"k","limit":10,"period":"1s","domain":"d"}"#,
            r#"{"key":"k","limit":10,"period":"1s",}"#,
            r#"{"key":"k","limit":10,"period":"1s"} x"#,
            r#"{"key":"k","limit":10 "period":"1s"}"#,
            r#"{"key":"k","limit":"10","period":"1s"}"#,
            r#"{"key":"k","limit":10,"period":"1s""#,
            r#"[{"key":"k","limit":10,"period":"1s"}]"#,
            "{\"key\":\"\t\",\"limit\":10,\"period\":\"1s\"}",
            "",
            "{}",
        ];
        for body in others {
            assert_eq!(ours(body.as_bytes()), None, "{body}");
        }
        // Every cut and every single-byte change of the plain bodies: the
        // scanner reads none that serde_json reads otherwise.
        for body in plain.map(str::as_bytes) {
            for end in 0..body.len() {
                let cut = &body[..end];
                if let Some(read) = ours(cut) {
                    assert_eq!(Some(read), serde(cut), "{}", String::from_utf8_lossy(cut));
                }
            }
            for at in 0..body.len() {
                for byte in [
                    b'"', b'\\', b'{', b'}', b',', b':', b' ', b'0', b'9', b'-', b'.', b'e', b'n',
                    0x01, 0xff,
                ] {
                    let mut changed = body.to_vec();
                    changed[at] = byte;
                    if let Some(read) = ours(&changed) {
                        assert_eq!(
                            Some(read),
                            serde(&changed),
                            "{}",
                            String::from_utf8_lossy(&changed)
                        );
                    }
                }
            }
        }
    }
}
