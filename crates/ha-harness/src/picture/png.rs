//! The PNG: our SVG rasterised by resvg (pure Rust: usvg parses, tiny-skia paints, fontdb finds
//! fonts), so the two files show the same picture. Fonts come from the system
//! (fonts-dejavu-core on Debian/Ubuntu), from a `fonts/` folder beside the executable (what
//! scripts/build.sh puts in dist/ for machines without fonts), and from `--font`.

use super::svg::FONT;
use resvg::{tiny_skia, usvg};
use std::path::{Path, PathBuf};

/// Where fonts are looked for besides the system's: `<exe dir>/fonts`.
fn beside_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("fonts"))
}

/// The font database: system fonts, `<exe dir>/fonts`, then `extra` (files or folders).
pub fn fonts(extra: &[PathBuf]) -> usvg::fontdb::Database {
    let mut db = usvg::fontdb::Database::new();
    db.load_system_fonts();
    if let Some(d) = beside_exe() {
        db.load_fonts_dir(d);
    }
    for p in extra {
        if p.is_dir() {
            db.load_fonts_dir(p);
        } else {
            let _ = db.load_font_file(p);
        }
    }
    db
}

/// The first family of our font stack the database has (else any it has).
fn family(db: &usvg::fontdb::Database) -> Option<String> {
    let have: Vec<&str> = db
        .faces()
        .flat_map(|f| f.families.iter().map(|(n, _)| n.as_str()))
        .collect();
    FONT.split(',')
        .map(str::trim)
        .find(|f| have.contains(f))
        .or(have.first().copied())
        .map(String::from)
}

/// Rasterise `svg` into `out`; a warning when no font was found (the PNG then has no text).
pub fn write(svg: &str, out: &Path, extra_fonts: &[PathBuf]) -> Result<Option<String>, String> {
    let mut opt = usvg::Options::default();
    let db = fonts(extra_fonts);
    let fam = family(&db);
    let warning = match &fam {
        None => Some(format!(
            "no font found: {} has no text. Install fonts-dejavu-core, put a .ttf into {}, or pass --font FILE",
            out.display(),
            beside_exe().map_or("<exe dir>/fonts".into(), |p| p.display().to_string())
        )),
        Some(_) => None,
    };
    *opt.fontdb_mut() = db;
    if let Some(f) = fam {
        opt.fontdb_mut().set_sans_serif_family(f.clone());
        opt.font_family = f;
    }
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| format!("reading our SVG: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| format!("no {}x{} canvas", size.width(), size.height()))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
        .save_png(out)
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picture_is_rasterised_with_its_colours() {
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"20\" height=\"10\"><rect width=\"10\" height=\"10\" fill=\"#ff0000\"/><rect x=\"10\" width=\"10\" height=\"10\" fill=\"#0000ff\"/></svg>";
        let out = std::env::temp_dir().join(format!("ha-png-{}.png", std::process::id()));
        write(svg, &out, &[]).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let p = tiny_skia::Pixmap::decode_png(&bytes).unwrap();
        assert_eq!((p.width(), p.height()), (20, 10));
        let px = |x: u32| {
            let c = p.pixel(x, 5).unwrap();
            (c.red(), c.green(), c.blue())
        };
        assert_eq!(px(2), (255, 0, 0));
        assert_eq!(px(17), (0, 0, 255));
    }
}
