//! KERNEL_GUIDE.md and the program chapters in docs/ are true to the code:
//! every `cuda` or `rust` code block in them must appear verbatim in a file
//! under cuda/, src/ or examples/.

use std::path::Path;

fn sources() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = String::new();
    let mut stack = vec![root.join("src"), root.join("cuda"), root.join("examples")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x == "rs" || x == "cu" || x == "cuh" || x == "h")
            {
                all += &std::fs::read_to_string(p).unwrap();
            }
        }
    }
    all
}

/// The `cuda` and `rust` code blocks of one Markdown file, each joined by lines.
fn snippets(doc: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let lang = line.trim_start().strip_prefix("```").unwrap_or("");
        if lang != "cuda" && lang != "rust" {
            continue;
        }
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        found.push(block.join("\n"));
    }
    found
}

#[test]
fn every_snippet_is_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let code = sources();
    let guide = std::fs::read_to_string(root.join("KERNEL_GUIDE.md")).unwrap();
    let mut checked = 0;
    for text in snippets(&guide) {
        assert!(
            code.contains(&text),
            "KERNEL_GUIDE.md snippet is not in the sources:\n{text}"
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} snippets found");
}

/// The chapters that moved out of KERNEL_GUIDE.md (docs/COLLECTIVES.md,
/// docs/PIPELINE.md, docs/SMALL_MESSAGES.md), and any other docs/*.md, quote
/// the code as the guide does.
#[test]
fn every_snippet_in_docs_is_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let code = sources();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let doc = std::fs::read_to_string(&path).unwrap();
        for text in snippets(&doc) {
            assert!(
                code.contains(&text),
                "{} snippet is not in the sources:\n{text}",
                path.strip_prefix(root).unwrap().display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} snippets found in docs/");
}
