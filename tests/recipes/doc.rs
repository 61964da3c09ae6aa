//! `docs/recipes.md` quotes compiled, tested code: each `<!-- quote: FILE#NAME
//! -->` marker there is followed by a code block that must be, verbatim, the
//! lines between `// ANCHOR: NAME` and `// ANCHOR_END: NAME` in `FILE`.

use std::fs;

fn read(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The lines of `source` between the anchors called `name`.
fn anchored<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let start = format!("// ANCHOR: {name}\n");
    let end = format!("// ANCHOR_END: {name}\n");
    let from = source.find(&start)? + start.len();
    let to = from + source[from..].find(&end)?;
    Some(&source[from..to])
}

/// Every `(FILE#NAME, code block)` quoted in `doc`.
fn quotes(doc: &str) -> Vec<(&str, &str)> {
    doc.split("<!-- quote: ")
        .skip(1)
        .map(|part| {
            let (target, rest) = part.split_once(" -->").expect("an unclosed quote marker");
            let (_, block) = rest.split_once("```rust\n").expect("a rust block after it");
            let (code, _) = block.split_once("```").expect("a closed rust block");
            (target, code)
        })
        .collect()
}

#[test]
fn the_recipes_quote_the_tested_code() {
    let doc = read("docs/recipes.md");
    let quotes = quotes(&doc);
    assert!(quotes.len() >= 5, "{} quotes", quotes.len());
    for (target, code) in quotes {
        let (path, name) = target.split_once('#').expect("FILE#NAME");
        let source = read(path);
        let tested = anchored(&source, name).unwrap_or_else(|| panic!("no anchor {target}"));
        assert_eq!(
            code, tested,
            "docs/recipes.md's {target} differs from the code"
        );
    }
}

#[test]
fn a_changed_quote_is_caught() {
    let source = "x\n// ANCHOR: a\nfn a() {}\n// ANCHOR_END: a\n";
    let doc = "<!-- quote: f#a -->\n```rust\nfn a() { }\n```\n";
    let [(target, code)] = quotes(doc)[..] else {
        panic!("one quote");
    };
    assert_eq!(target, "f#a");
    assert_ne!(Some(code), anchored(source, "a"));
    assert_eq!(anchored(source, "a"), Some("fn a() {}\n"));
}
