//! Typed kernel names generated from the sources: [`scan_source`] finds the `extern "C"`
//! kernels a `.cu` file defines (directly, or through the function-like macros of the file and
//! of the headers it includes with `#include "..."`), [`group`] folds the `<base>_<dtype>_<op>`
//! instances into families, and [`write_names`] writes a Rust module tree with one const per
//! code object, per plain kernel and per family, so a misspelt kernel is a compile error.
//!
//! The scan is a small preprocessor, not a C++ parser: comments are dropped, `\` continuations
//! joined, `#define NAME(params) body` recorded (a macro defined more than once, under
//! `#if` branches, expands to the union of its bodies, so the names are the same on every
//! backend), invocations of those macros expanded (parameters substituted, `##` pasted,
//! nested invocations followed), and every `extern "C" ... __global__ ... NAME(` in the result
//! is a kernel (attributes such as `__launch_bounds__(1024)` before the name are skipped).
//! Kernels inside an `extern "C" { ... }` block are not found.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The suffixes that make a kernel an instance of a family: `<base>_<dtype>_<op>` with
/// `<dtype>` one of `dtypes` and `<op>` one of `ops`.
#[derive(Clone, Copy, Debug)]
pub struct Vocabulary<'a> {
    /// Data type spellings (`f32`, `bf16`, ...).
    pub dtypes: &'a [&'a str],
    /// Reduction op spellings (`sum`, `max`, ...).
    pub ops: &'a [&'a str],
}

/// What a source defines, in order of first appearance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A kernel that is no instance of a family.
    Kernel(String),
    /// Kernels `<base>_<dtype>_<op>`: the base and the (dtype, op) pairs, in source order.
    Family {
        /// The common prefix.
        base: String,
        /// (dtype, op) of each instance.
        instances: Vec<(String, String)>,
    },
}

/// How [`write_names`] spells the generated items.
#[derive(Clone, Copy, Debug)]
pub struct NameOptions<'a> {
    /// Path of the module that defines `CodeObject`, `Kernel` and `Family` (each with a
    /// `const fn new`), e.g. `crate::kernels`.
    pub types: &'a str,
    /// The instance suffixes of families.
    pub vocabulary: Vocabulary<'a>,
    /// Where the sources are, for the docs (`kernels/cuda/src`).
    pub shown_root: &'a str,
}

/// A function-like macro: its parameters and every body it is defined with.
#[derive(Default)]
struct Macro {
    params: Vec<String>,
    bodies: Vec<String>,
}

/// Deepest nesting of macro invocations followed.
const MAX_DEPTH: usize = 16;

/// The `extern "C"` kernels `path` defines (with what the headers it includes define), each
/// once, in order of first appearance.
pub fn scan_source(path: &Path) -> Result<Vec<String>, String> {
    let mut macros: BTreeMap<String, Macro> = BTreeMap::new();
    let mut code = Vec::new();
    let mut seen = Vec::new();
    collect(path, &mut macros, &mut code, &mut seen)?;
    let mut names = Vec::new();
    for text in &code {
        scan_text(text, &macros, 0, &mut names)?;
    }
    Ok(names)
}

/// Reads `path` and, first, the files it includes with quotes (relative to its folder; a
/// missing one is skipped, the compiler reports it): their macros into `macros`, the lines
/// that are no preprocessor directive into `code`.
fn collect(
    path: &Path,
    macros: &mut BTreeMap<String, Macro>,
    code: &mut Vec<String>,
    seen: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    if seen.contains(&canon) {
        return Ok(());
    }
    seen.push(canon);
    let raw =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let text = join_continuations(&strip_comments(&raw));
    let mut plain = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(directive) = t.strip_prefix('#') else {
            plain.push_str(line);
            plain.push('\n');
            continue;
        };
        let directive = directive.trim_start();
        if let Some(rest) = directive.strip_prefix("include") {
            let rest = rest.trim();
            if let Some(inc) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                let file = path.parent().unwrap_or(Path::new(".")).join(inc);
                if file.is_file() {
                    collect(&file, macros, code, seen)?;
                }
            }
        } else if let Some(rest) = directive.strip_prefix("define") {
            if let Some((name, params, body)) = parse_define(rest) {
                let m = macros.entry(name).or_default();
                m.params = params;
                m.bodies.push(body);
            }
        }
    }
    code.push(plain);
    Ok(())
}

/// `NAME(a, b) body` of a `#define` (function-like only: `(` right after the name).
fn parse_define(rest: &str) -> Option<(String, Vec<String>, String)> {
    let rest = rest.trim_start();
    let end = ident_end(rest, 0);
    if end == 0 || !rest[end..].starts_with('(') {
        return None;
    }
    let close = rest[end..].find(')')? + end;
    let params = rest[end + 1..close]
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    Some((
        rest[..end].to_string(),
        params,
        rest[close + 1..].to_string(),
    ))
}

/// `text` without `//` and `/* */` comments (newlines kept; string literals left alone).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut start = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                out.push_str(&text[start..i]);
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                start = i;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.push_str(&text[start..i]);
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                i += 2;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < b.len() {
        out.push_str(&text[start..]);
    }
    out
}

/// Lines ending in `\` joined with the next.
fn join_continuations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                out.push_str(head);
                out.push(' ');
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The end of the identifier starting at `i` (`i` when there is none).
fn ident_end(s: &str, i: usize) -> usize {
    let b = s.as_bytes();
    if i >= b.len() || !is_ident_start(b[i]) {
        return i;
    }
    let mut j = i + 1;
    while j < b.len() && is_ident(b[j]) {
        j += 1;
    }
    j
}

fn skip_ws(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The index after the `)` matching the `(` at `open`.
fn matching_paren(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, c) in s.as_bytes()[open..].iter().enumerate() {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + k + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Kernels defined in `text` (after expanding the macros it invokes) appended to `names`.
fn scan_text(
    text: &str,
    macros: &BTreeMap<String, Macro>,
    depth: usize,
    names: &mut Vec<String>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "macro expansion deeper than {MAX_DEPTH} levels (a recursive macro?)"
        ));
    }
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            // `extern "C"` is found from its `extern`; other literals are skipped whole.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        if !is_ident_start(b[i]) || (i > 0 && is_ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let end = ident_end(text, i);
        let word = &text[i..end];
        if word == "extern" {
            if let Some((name, after)) = kernel_after_extern(text, end) {
                if !names.contains(&name) {
                    names.push(name);
                }
                i = after;
                continue;
            }
        } else if let Some(m) = macros.get(word) {
            let open = skip_ws(text, end);
            if b.get(open) == Some(&b'(') {
                let close = matching_paren(text, open)
                    .ok_or_else(|| format!("unclosed invocation of macro {word}"))?;
                let args = split_args(&text[open + 1..close - 1]);
                for body in &m.bodies {
                    let expanded = substitute(body, &m.params, &args);
                    scan_text(&expanded, macros, depth + 1, names)?;
                }
                i = close;
                continue;
            }
        }
        i = end;
    }
    Ok(())
}

/// After `extern` at `i`: `"C"`, then identifiers up to the kernel's name and its `(`, one of
/// them `__global__`; `__`-attributes with arguments (`__launch_bounds__(1024)`) are skipped.
/// Returns the name and where its parameter list starts.
fn kernel_after_extern(text: &str, i: usize) -> Option<(String, usize)> {
    let mut i = skip_ws(text, i);
    i += text[i..].strip_prefix("\"C\"").map(|_| 3)?;
    let b = text.as_bytes();
    let mut global = false;
    loop {
        i = skip_ws(text, i);
        let end = ident_end(text, i);
        if end == i {
            return None;
        }
        let word = &text[i..end];
        let next = skip_ws(text, end);
        if b.get(next) == Some(&b'(') {
            if word.starts_with("__") {
                i = matching_paren(text, next)?;
                continue;
            }
            return global.then(|| (word.to_string(), next));
        }
        global |= word == "__global__";
        i = end;
    }
}

/// Top-level comma-separated arguments, trimmed.
fn split_args(s: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                args.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() || !args.is_empty() {
        args.push(cur.trim().to_string());
    }
    args
}

/// `body` with each parameter replaced by its argument and `##` pasted.
fn substitute(body: &str, params: &[String], args: &[String]) -> String {
    let mut out = String::with_capacity(body.len());
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if is_ident_start(b[i]) && (i == 0 || !is_ident(b[i - 1])) {
            let end = ident_end(body, i);
            let word = &body[i..end];
            match params.iter().position(|p| p == word) {
                Some(k) => out.push_str(args.get(k).map_or("", |a| a.as_str())),
                None => out.push_str(word),
            }
            i = end;
        } else {
            let c = body[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    // Token pasting: `a ## b` -> `ab`.
    while let Some(k) = out.find("##") {
        let head = out[..k].trim_end().len();
        let tail = k + 2 + (out.len() - k - 2 - out[k + 2..].trim_start().len());
        out.replace_range(head..tail, "");
    }
    out
}

/// Folds the instances `<base>_<dtype>_<op>` of `names` into families (a family keeps the
/// place of its first instance); every other name stays a plain kernel.
pub fn group(names: &[String], vocab: &Vocabulary<'_>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    for name in names {
        let Some((base, dtype, op)) = split_instance(name, vocab) else {
            entries.push(Entry::Kernel(name.clone()));
            continue;
        };
        let pair = (dtype.to_string(), op.to_string());
        let found = entries.iter_mut().find_map(|e| match e {
            Entry::Family { base: b, instances } if b == base => Some(instances),
            _ => None,
        });
        match found {
            Some(instances) => instances.push(pair),
            None => entries.push(Entry::Family {
                base: base.to_string(),
                instances: vec![pair],
            }),
        }
    }
    entries
}

/// `(base, dtype, op)` of an instance name.
fn split_instance<'n>(
    name: &'n str,
    vocab: &Vocabulary<'_>,
) -> Option<(&'n str, &'n str, &'n str)> {
    for op in vocab.ops {
        let Some(rest) = name.strip_suffix(op).and_then(|r| r.strip_suffix('_')) else {
            continue;
        };
        for dtype in vocab.dtypes {
            if let Some(base) = rest.strip_suffix(dtype).and_then(|r| r.strip_suffix('_')) {
                if !base.is_empty() {
                    let d = &rest[rest.len() - dtype.len()..];
                    let o = &name[name.len() - op.len()..];
                    return Some((base, d, o));
                }
            }
        }
    }
    None
}

/// One node of the generated module tree.
#[derive(Default)]
struct Node {
    /// The source file of this module, with its object path (None: names only) and entries.
    file: Option<(String, Option<PathBuf>, Vec<Entry>)>,
    children: BTreeMap<String, Node>,
}

/// Writes `file`: for every `.cu` under `src_root`, a module at its path (`a/b.cu` is
/// `a::b`) holding `OBJECT` (its code object: the stem and the bytes from `objects` embedded
/// with `include_bytes!`, `None` when `objects` has none for it) and one const per plain kernel
/// (`Kernel`) and per family (`Family`), named after the kernel or the family's base in upper
/// case; a source with exactly one kernel or family also gets a const named after the file in
/// its folder's module (`a::B`). Every folder module (and the root) has `OBJECTS`, every code
/// object below it. The names are the same whether or not anything was compiled.
pub fn write_names(
    file: &Path,
    src_root: &Path,
    objects: &[(String, PathBuf)],
    opts: &NameOptions<'_>,
) -> Result<(), String> {
    let mut root = Node::default();
    for src in crate::list_sources(src_root) {
        let stem = crate::stem_of(&src, src_root);
        let entries = group(&scan_source(&src)?, &opts.vocabulary);
        let object = objects
            .iter()
            .find(|(s, _)| *s == stem)
            .map(|(_, p)| p.clone());
        let mut node = &mut root;
        for part in stem.split('/') {
            node = node.children.entry(module_ident(part, &stem)?).or_default();
        }
        node.file = Some((stem, object, entries));
    }
    let mut gen = format!(
        "// @generated by mscclpp-kernel-build from {}: one module per source; do not edit.\n\n",
        opts.shown_root
    );
    emit(&root, "", opts, 0, &mut gen)?;
    std::fs::write(file, gen).map_err(|e| format!("writing {}: {e}", file.display()))
}

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut",
    "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true", "type", "unsafe",
    "use", "where", "while", "abstract", "become", "box", "do", "final", "macro", "override",
    "priv", "try", "typeof", "unsized", "virtual", "yield",
];

/// A module name for a path component of `stem`.
fn module_ident(part: &str, stem: &str) -> Result<String, String> {
    let id: String = part
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if id.is_empty()
        || id.starts_with(|c: char| c.is_ascii_digit())
        || KEYWORDS.contains(&id.as_str())
    {
        return Err(format!(
            "kernel source `{stem}`: `{part}` makes no Rust module name (rename it: letters, digits, `_`, not a keyword)"
        ));
    }
    Ok(id)
}

fn const_ident(name: &str) -> String {
    name.to_ascii_uppercase()
}

fn indent(level: usize) -> String {
    "    ".repeat(level)
}

/// Every code object path (`a::b::OBJECT`, relative to `node`) below `node`.
fn object_paths(node: &Node, prefix: &str, out: &mut Vec<String>) {
    if node.file.is_some() {
        out.push(format!("{prefix}OBJECT"));
    }
    for (name, child) in &node.children {
        object_paths(child, &format!("{prefix}{name}::"), out);
    }
}

fn entry_const(e: &Entry) -> String {
    match e {
        Entry::Kernel(n) => const_ident(n),
        Entry::Family { base, .. } => const_ident(base),
    }
}

fn emit(
    node: &Node,
    path: &str,
    opts: &NameOptions<'_>,
    level: usize,
    gen: &mut String,
) -> Result<(), String> {
    let ind = indent(level);
    let t = opts.types;
    let shown = if path.is_empty() {
        opts.shown_root.to_string()
    } else {
        format!("{}/{path}", opts.shown_root)
    };
    let mut objects = Vec::new();
    object_paths(node, "", &mut objects);
    let mut taken: Vec<String> = Vec::new();
    let mut claim = |name: String, what: &str| -> Result<String, String> {
        if taken.contains(&name) {
            return Err(format!(
                "{shown}: two generated items are named `{name}` (the second is {what}); rename a kernel or a file"
            ));
        }
        taken.push(name.clone());
        Ok(name)
    };
    if !node.children.is_empty() {
        let name = claim("OBJECTS".into(), "the list of code objects")?;
        let _ = writeln!(
            gen,
            "{ind}/// Every code object below `{shown}` (embedded or not).\n{ind}pub const {name}: &[&{t}::CodeObject] = &["
        );
        for o in &objects {
            let _ = writeln!(gen, "{ind}    &{o},");
        }
        let _ = writeln!(gen, "{ind}];");
    }
    if let Some((stem, object, entries)) = &node.file {
        let code = match object {
            Some(p) => format!("Some(include_bytes!({:?}))", p.display().to_string()),
            None => "None".to_string(),
        };
        let name = claim("OBJECT".into(), "the code object")?;
        let _ = writeln!(
            gen,
            "{ind}/// The code object of `{}/{stem}.cu`.\n{ind}pub const {name}: {t}::CodeObject = {t}::CodeObject::new({stem:?}, {code});",
            opts.shown_root
        );
        for e in entries {
            let name = claim(entry_const(e), "a kernel")?;
            match e {
                Entry::Kernel(k) => {
                    let _ = writeln!(
                        gen,
                        "{ind}/// Kernel `{k}` of `{stem}`.\n{ind}pub const {name}: {t}::Kernel = {t}::Kernel::new(&OBJECT, {k:?});"
                    );
                }
                Entry::Family { base, instances } => {
                    let _ = writeln!(
                        gen,
                        "{ind}/// Kernel family `{base}_<dtype>_<op>` of `{stem}` ({} instances).\n{ind}pub const {name}: {t}::Family = {t}::Family::new(&OBJECT, {base:?}, &[",
                        instances.len()
                    );
                    for (d, o) in instances {
                        let _ = writeln!(gen, "{ind}    ({d:?}, {o:?}, \"{base}_{d}_{o}\"),");
                    }
                    let _ = writeln!(gen, "{ind}]);");
                }
            }
        }
    }
    for (name, child) in &node.children {
        if let Some((stem, _, entries)) = &child.file {
            if let [only] = entries.as_slice() {
                let alias = claim(const_ident(name), "a file's single kernel")?;
                let (ty, what) = match only {
                    Entry::Kernel(_) => ("Kernel", "kernel"),
                    Entry::Family { .. } => ("Family", "kernel family"),
                };
                let target = entry_const(only);
                let _ = writeln!(
                    gen,
                    "{ind}/// The one {what} of `{stem}.cu`: [`{name}::{target}`].\n{ind}pub const {alias}: {t}::{ty} = {name}::{target};"
                );
            }
        }
    }
    for (name, child) in &node.children {
        let child_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}/{name}")
        };
        let what = if child.file.is_some() && child.children.is_empty() {
            format!("The kernels of `{}/{child_path}.cu`.", opts.shown_root)
        } else {
            format!("The kernels below `{}/{child_path}`.", opts.shown_root)
        };
        let _ = writeln!(gen, "{ind}/// {what}");
        if path.rsplit('/').next() == Some(name.as_str()) {
            let _ = writeln!(
                gen,
                "{ind}#[allow(clippy::module_inception)] // the source is named after its folder"
            );
        }
        let _ = writeln!(gen, "{ind}pub mod {name} {{");
        emit(child, &child_path, opts, level + 1, gen)?;
        let _ = writeln!(gen, "{ind}}}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: Vocabulary<'static> = Vocabulary {
        dtypes: &["f16", "bf16", "f32"],
        ops: &["sum", "max"],
    };

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kernel-names-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn plain_kernels_macro_instances_and_includes_are_found() {
        let d = temp("scan");
        std::fs::write(
            d.join("common.hpp"),
            "#define OP_INST(NAME, T, TN) \\\n  extern \"C\" __global__ void __launch_bounds__(1024) NAME##_##TN##_sum(int a) { f<T>(a); } \\\n  extern \"C\" __global__ void NAME ## _ ## TN ## _max(int a) {}\n#if defined(X)\n#define MORE(NAME) OP_INST(NAME, float, f32)\n#else\n#define MORE(NAME)\n#endif\n#define ALL(NAME, TEMPLATE) OP_INST(NAME, __half, f16) OP_INST(NAME, bf16_t, bf16) MORE(NAME)\n",
        )
        .expect("header");
        let src = d.join("k.cu");
        std::fs::write(
            &src,
            "// extern \"C\" __global__ void commented(int);\n#include \"common.hpp\"\n#include <cuda.h>\n/* extern \"C\" __global__ void block_commented() */\nextern \"C\" __global__ void __launch_bounds__(256) plain(int* p) {}\nextern \"C\" void host_only(int);\nALL(fam, tmpl)\n",
        )
        .expect("source");
        let names = scan_source(&src).expect("scan");
        assert_eq!(
            names,
            [
                "plain",
                "fam_f16_sum",
                "fam_f16_max",
                "fam_bf16_sum",
                "fam_bf16_max",
                "fam_f32_sum",
                "fam_f32_max"
            ]
        );
        let entries = group(&names, &VOCAB);
        assert_eq!(entries[0], Entry::Kernel("plain".into()));
        let Entry::Family { base, instances } = &entries[1] else {
            panic!("expected a family, got {entries:?}");
        };
        assert_eq!(base, "fam");
        assert_eq!(instances.len(), 6);
        assert_eq!(instances[2], ("bf16".to_string(), "sum".to_string()));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn generated_tree_has_objects_kernels_families_and_aliases() {
        let d = temp("write");
        std::fs::create_dir_all(d.join("coll")).expect("dir");
        std::fs::write(
            d.join("coll").join("one.cu"),
            "extern \"C\" __global__ void one_f32_sum() {}\nextern \"C\" __global__ void one_f16_sum() {}\n",
        )
        .expect("one");
        std::fs::write(
            d.join("two.cu"),
            "extern \"C\" __global__ void a() {}\nextern \"C\" __global__ void b() {}\n",
        )
        .expect("two");
        let out = d.join("names.rs");
        let objects = vec![("two".to_string(), PathBuf::from("/x/two.fatbin"))];
        let opts = NameOptions {
            types: "crate::k",
            vocabulary: VOCAB,
            shown_root: "src",
        };
        write_names(&out, &d, &objects, &opts).expect("write");
        let gen = std::fs::read_to_string(&out).expect("read");
        for want in [
            "pub const OBJECTS: &[&crate::k::CodeObject] = &[",
            "&coll::one::OBJECT,",
            "&two::OBJECT,",
            "pub const ONE: crate::k::Family = one::ONE;",
            "crate::k::CodeObject::new(\"coll/one\", None);",
            "(\"f16\", \"sum\", \"one_f16_sum\"),",
            "crate::k::CodeObject::new(\"two\", Some(include_bytes!(\"/x/two.fatbin\")));",
            "pub const A: crate::k::Kernel = crate::k::Kernel::new(&OBJECT, \"a\");",
        ] {
            assert!(gen.contains(want), "missing {want:?} in\n{gen}");
        }
        assert!(
            !gen.contains("pub const TWO"),
            "two kernels: no alias\n{gen}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn clashing_names_are_refused() {
        let d = temp("clash");
        std::fs::write(
            d.join("objects.cu"),
            "extern \"C\" __global__ void k() {}\n",
        )
        .expect("src");
        std::fs::create_dir_all(d.join("sub")).expect("dir");
        std::fs::write(d.join("sub").join("x.cu"), "").expect("src");
        let opts = NameOptions {
            types: "t",
            vocabulary: VOCAB,
            shown_root: "src",
        };
        let err = write_names(&d.join("n.rs"), &d, &[], &opts).expect_err("clash");
        assert!(err.contains("OBJECTS"), "{err}");
        std::fs::write(d.join("sub").join("type.cu"), "").expect("src");
        let _ = std::fs::remove_file(d.join("objects.cu"));
        let err = write_names(&d.join("n.rs"), &d, &[], &opts).expect_err("keyword");
        assert!(err.contains("type"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
