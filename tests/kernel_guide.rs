//! KERNEL_GUIDE.md is true to the code: every `cuda` or `rust` code block in
//! it must appear verbatim in a file under cuda/, src/ or examples/.

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

#[test]
fn every_snippet_is_the_code() {
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("KERNEL_GUIDE.md"))
            .unwrap();
    let code = sources();
    let mut checked = 0;
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        let lang = line.trim_start().strip_prefix("```").unwrap_or("");
        if lang != "cuda" && lang != "rust" {
            continue;
        }
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        let text = block.join("\n");
        assert!(
            code.contains(&text),
            "KERNEL_GUIDE.md snippet is not in the sources:\n{text}"
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} snippets found");
}
