//! The variables the test framework reads, one parser each (the crate's only reads of the
//! process environment; the launcher's rank variables are read by `mp_tests`).
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `MSCCLPP_FUZZ_CASES` | 256 | cases each property-based fuzz target of the workspace runs |

/// The fuzz budget's variable.
pub const FUZZ_CASES: &str = "MSCCLPP_FUZZ_CASES";

/// How many cases each property-based fuzz target of the workspace runs: the value of
/// `MSCCLPP_FUZZ_CASES`, or 256 (what CI runs) when it is unset or not a number. One place
/// for the budget that the proptest suites of `mscclpp`, this crate and `mp_tests` share.
pub fn fuzz_cases() -> u32 {
    parse_fuzz_cases(std::env::var(FUZZ_CASES).ok().as_deref())
}

/// The parser of [`FUZZ_CASES`]: a number, else 256.
pub fn parse_fuzz_cases(value: Option<&str>) -> u32 {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(256)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_cases_default_and_value() {
        assert_eq!(parse_fuzz_cases(None), 256);
        assert_eq!(parse_fuzz_cases(Some("x")), 256);
        assert_eq!(parse_fuzz_cases(Some(" 12 ")), 12);
    }
}
