//! Parse `cargo llvm-cov show-env --export-prefix` (`export K='V'` lines) into variables.
//!
//! Values are shell words: single quotes (with `'\''` for a quote), double quotes with
//! backslash escapes, or bare words. The instrumentation flags contain a `\x1f` separator,
//! which is kept byte for byte. Lines that are not `export` lines are ignored.

use crate::CoverageError;

/// `(name, value)` pairs in the order printed.
pub fn parse_show_env(text: &str) -> Result<Vec<(String, String)>, CoverageError> {
    let mut vars = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let err = |message: String| CoverageError::ShowEnv {
            line: index + 1,
            message,
        };
        let Some(assignment) = line.trim_start().strip_prefix("export ") else {
            continue;
        };
        let Some((name, raw)) = assignment.split_once('=') else {
            return Err(err(format!("expected export NAME=VALUE, found {line:?}")));
        };
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(err(format!("expected a variable name, found {name:?}")));
        }
        let value = unquote(raw).map_err(err)?;
        vars.push((name.to_string(), value));
    }
    Ok(vars)
}

/// Undo shell quoting of one word.
fn unquote(raw: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => loop {
                match chars.next() {
                    Some('\'') => break,
                    Some(c) => out.push(c),
                    None => return Err(format!("unterminated single quote in {raw:?}")),
                }
            },
            '"' => loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('$' | '`' | '"' | '\\')) => out.push(c),
                        Some('\n') => {}
                        Some(c) => {
                            out.push('\\');
                            out.push(c);
                        }
                        None => return Err(format!("unterminated double quote in {raw:?}")),
                    },
                    Some(c) => out.push(c),
                    None => return Err(format!("unterminated double quote in {raw:?}")),
                }
            },
            '\\' => match chars.next() {
                Some(c) => out.push(c),
                None => return Err(format!("trailing backslash in {raw:?}")),
            },
            c if c.is_whitespace() => {
                return Err(format!("expected one shell word, found a space in {raw:?}"))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Make sure every process writes its own profile: a `LLVM_PROFILE_FILE` pattern without `%p`
/// gets `-%p` before its `.profraw` extension (or at the end). `%m` alone would merge profiles
/// of concurrent ranks into one file online; `%p` keeps one file per rank as the design asks.
pub fn per_process_profile_pattern(pattern: &str) -> String {
    if pattern.contains("%p") {
        return pattern.to_string();
    }
    match pattern.strip_suffix(".profraw") {
        Some(stem) => format!("{stem}-%p.profraw"),
        None => format!("{pattern}-%p"),
    }
}
