//! A small SVG writer: the few elements the picture uses (rectangles, lines, polylines,
//! text), attributes escaped, numbers rounded to 0.1 px.

/// Font stack of every text (the PNG renderer finds one of them among the system's fonts).
pub const FONT: &str = "DejaVu Sans, Liberation Sans, Noto Sans, Arial, Helvetica, sans-serif";

pub struct Svg {
    pub width: f64,
    pub height: f64,
    body: String,
}

/// `&`, `<`, `>`, `"` escaped for text and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn n(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == r.trunc() {
        format!("{}", r as i64)
    } else {
        format!("{r:.1}")
    }
}

/// How a text is anchored at its x.
#[derive(Clone, Copy)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// Text style: size (px), colour, weight, anchor.
#[derive(Clone, Copy)]
pub struct Font<'a> {
    pub size: f64,
    pub color: &'a str,
    pub bold: bool,
    pub anchor: Anchor,
}

impl<'a> Font<'a> {
    pub fn new(size: f64, color: &'a str) -> Font<'a> {
        Font {
            size,
            color,
            bold: false,
            anchor: Anchor::Start,
        }
    }
    pub fn bold(self) -> Font<'a> {
        Font { bold: true, ..self }
    }
    pub fn anchor(self, anchor: Anchor) -> Font<'a> {
        Font { anchor, ..self }
    }
}

/// About how wide `s` is in DejaVu Sans at `size` px (for placing labels).
pub fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.58
}

impl Svg {
    pub fn new(width: f64, height: f64) -> Svg {
        Svg {
            width,
            height,
            body: String::new(),
        }
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, opacity: f64) {
        if w <= 0.0 || h <= 0.0 {
            return;
        }
        self.body += &format!(
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" fill-opacity=\"{}\"/>\n",
            n(x),
            n(y),
            n(w),
            n(h),
            esc(fill),
            (opacity.clamp(0.0, 1.0) * 100.0).round() / 100.0
        );
    }

    /// A line; `dash` is an SVG dash array ("" = solid).
    #[allow(clippy::too_many_arguments)]
    pub fn line(
        &mut self,
        x1: f64,
        y1: f64,
        x2: f64,
        y2: f64,
        color: &str,
        width: f64,
        dash: &str,
    ) {
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(" stroke-dasharray=\"{}\"", esc(dash))
        };
        self.body += &format!(
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"{}\"{dash}/>\n",
            n(x1),
            n(y1),
            n(x2),
            n(y2),
            esc(color),
            n(width)
        );
    }

    pub fn polyline(&mut self, pts: &[(f64, f64)], color: &str, width: f64) {
        if pts.len() < 2 {
            return;
        }
        let p: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{},{}", n(*x), n(*y)))
            .collect();
        self.body += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-linejoin=\"round\"/>\n",
            p.join(" "),
            esc(color),
            n(width)
        );
    }

    /// A filled shape.
    pub fn polygon(&mut self, pts: &[(f64, f64)], fill: &str, opacity: f64) {
        if pts.len() < 3 {
            return;
        }
        let p: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{},{}", n(*x), n(*y)))
            .collect();
        self.body += &format!(
            "<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"{}\"/>\n",
            p.join(" "),
            esc(fill),
            (opacity.clamp(0.0, 1.0) * 100.0).round() / 100.0
        );
    }

    pub fn text(&mut self, x: f64, y: f64, s: &str, f: Font) {
        let anchor = match f.anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        self.body += &format!(
            "<text x=\"{}\" y=\"{}\" font-family=\"{FONT}\" font-size=\"{}\" fill=\"{}\"{} text-anchor=\"{anchor}\">{}</text>\n",
            n(x),
            n(y),
            n(f.size),
            esc(f.color),
            if f.bold { " font-weight=\"bold\"" } else { "" },
            esc(s)
        );
    }

    /// The document.
    pub fn finish(&self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{}</svg>\n",
            self.body,
            w = n(self.width),
            h = n(self.height)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_escaped_and_rounded() {
        let mut s = Svg::new(100.0, 50.0);
        s.rect(1.04, 2.0, 3.0, 4.0, "#f00", 0.25);
        s.rect(0.0, 0.0, 0.0, 4.0, "#f00", 1.0);
        s.line(0.0, 0.0, 10.0, 10.0, "red", 1.5, "4 2");
        s.polyline(&[(0.0, 1.0), (2.56, 3.0)], "blue", 2.0);
        s.text(
            5.0,
            6.0,
            "a < b & \"c\"",
            Font::new(12.0, "#000").bold().anchor(Anchor::End),
        );
        let d = s.finish();
        assert!(d.contains("<rect x=\"1\" y=\"2\" width=\"3\" height=\"4\" fill=\"#f00\" fill-opacity=\"0.25\"/>"), "{d}");
        assert_eq!(
            d.matches("<rect").count(),
            2,
            "a zero-width rectangle is dropped"
        );
        assert!(d.contains("stroke-dasharray=\"4 2\""));
        assert!(d.contains("points=\"0,1 2.6,3\""), "{d}");
        assert!(
            d.contains(
                "font-weight=\"bold\" text-anchor=\"end\">a &lt; b &amp; &quot;c&quot;</text>"
            ),
            "{d}"
        );
        assert!(d.starts_with("<?xml") && d.ends_with("</svg>\n"));
    }
}
