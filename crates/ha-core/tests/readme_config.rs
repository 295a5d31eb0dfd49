//! The README's configuration section must be exactly `config::markdown_table()`.
//! Run with `UPDATE_README=1` to rewrite the section from the table instead of failing.

use ha_core::config::markdown_table;
use std::path::Path;

const START: &str = "<!-- config-table:start -->\n";
const END: &str = "<!-- config-table:end -->";

#[test]
fn readme_config_table_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).expect("read README.md");
    let start = readme
        .find(START)
        .expect("README.md lacks the `<!-- config-table:start -->` marker line")
        + START.len();
    let end = start
        + readme[start..]
            .find(END)
            .expect("README.md lacks `<!-- config-table:end -->` after the start marker");
    let expected = markdown_table();
    let actual = &readme[start..end];
    if actual == expected {
        return;
    }
    if std::env::var_os("UPDATE_README").is_some_and(|v| v == "1") {
        let updated = format!("{}{expected}{}", &readme[..start], &readme[end..]);
        std::fs::write(&path, updated).expect("rewrite README.md");
        eprintln!("README.md configuration table regenerated");
        return;
    }
    panic!(
        "README.md's configuration table is stale (run `UPDATE_README=1 cargo test -p ha-core --test \
         readme_config` to regenerate it). Expected between the markers:\n{expected}"
    );
}
