//! Bearer tokens: the admin API's (`--admin-token`) and, when given, the
//! check APIs' (`--api-token`). A token is compared in constant time (its
//! length may show, its content does not) and never shown by `Debug`.

use std::fmt;
use std::str::FromStr;

use subtle::ConstantTimeEq;

/// One bearer token.
#[derive(Clone)]
pub(crate) struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl FromStr for Token {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err("a token must not be empty".into());
        }
        Ok(Self(s.to_owned()))
    }
}

/// Whether the `Authorization` value `given` (`Bearer <token>`) carries one
/// of `tokens`. Each is compared in full, so the time taken does not say
/// which one came close.
pub(crate) fn admits(tokens: &[Token], given: Option<&str>) -> bool {
    let Some(given) = given.and_then(|v| v.strip_prefix("Bearer ")) else {
        return false;
    };
    tokens.iter().fold(false, |found, token| {
        let equal: bool = token.0.as_bytes().ct_eq(given.as_bytes()).into();
        found | equal
    })
}

/// What admits a call to a check door: one of `tokens`, or anything when
/// there are none.
pub(crate) fn admits_any(tokens: &[Token]) -> Option<tollgate_envoy::Admits> {
    if tokens.is_empty() {
        return None;
    }
    let tokens = tokens.to_vec();
    Some(Box::new(move |given| admits(&tokens, given)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(all: &[&str]) -> Vec<Token> {
        all.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn only_a_bearer_with_a_known_token_is_admitted() {
        let two = tokens(&["old", "new"]);
        assert!(admits(&two, Some("Bearer old")));
        assert!(admits(&two, Some("Bearer new")));
        for refused in [
            None,
            Some("Bearer"),
            Some("Bearer "),
            Some("old"),
            Some("Basic old"),
            Some("Bearer ol"),
            Some("Bearer old "),
        ] {
            assert!(!admits(&two, refused), "{refused:?}");
        }
        assert!(!admits(&[], Some("Bearer old")));
    }

    #[test]
    fn empty_tokens_are_refused_and_never_shown() {
        assert!(" ".parse::<Token>().is_err());
        let token: Token = "secret".parse().unwrap();
        assert!(!format!("{token:?}").contains("secret"));
    }
}
