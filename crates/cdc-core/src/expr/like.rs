//! `LIKE` / `ILIKE` patterns: `%` matches any run of characters, `_` exactly one character (a whole
//! UTF-8 character, not a byte), the escape character (default `\`) makes the next character
//! literal; `ESCAPE ''` turns escaping off. Matching is iterative (no recursion, no backtracking
//! blow-up beyond O(pattern x text)).

/// Why a pattern is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LikeErr {
    /// The pattern ends with the escape character.
    EndsWithEscape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Lit(u8),
    One,
    Any,
}

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LikePat {
    toks: Vec<Tok>,
    ci: bool,
}

fn char_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

impl LikePat {
    /// Compiles `pattern`; `ci` for ILIKE (the pattern is lower-cased here, the text when matched).
    pub(crate) fn compile(pattern: &[u8], escape: Option<char>, ci: bool) -> Result<LikePat, LikeErr> {
        let text = String::from_utf8_lossy(pattern);
        let mut toks = Vec::with_capacity(pattern.len());
        let mut chars = text.chars();
        let mut buf = [0u8; 4];
        let mut push_lit = |toks: &mut Vec<Tok>, c: char| {
            if ci {
                for l in c.to_lowercase() {
                    toks.extend(l.encode_utf8(&mut buf).bytes().map(Tok::Lit));
                }
            } else {
                toks.extend(c.encode_utf8(&mut buf).bytes().map(Tok::Lit));
            }
        };
        while let Some(c) = chars.next() {
            if Some(c) == escape {
                let lit = chars.next().ok_or(LikeErr::EndsWithEscape)?;
                push_lit(&mut toks, lit);
            } else if c == '%' {
                if toks.last() != Some(&Tok::Any) {
                    toks.push(Tok::Any);
                }
            } else if c == '_' {
                toks.push(Tok::One);
            } else {
                push_lit(&mut toks, c);
            }
        }
        Ok(LikePat { toks, ci })
    }

    /// Whether `text` matches. ILIKE lower-cases with Unicode rules (ASCII text without allocating).
    pub(crate) fn matches(&self, text: &[u8]) -> bool {
        if !self.ci {
            return match_toks(&self.toks, text, false);
        }
        if text.is_ascii() {
            return match_toks(&self.toks, text, true);
        }
        let lower = String::from_utf8_lossy(text).to_lowercase();
        match_toks(&self.toks, lower.as_bytes(), false)
    }
}

fn match_toks(t: &[Tok], s: &[u8], fold_ascii: bool) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    // After the last `%`: where the pattern resumes and where the text was when it was tried.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if p < t.len() {
            match t[p] {
                Tok::Any => {
                    star = Some((p + 1, i));
                    p += 1;
                    continue;
                }
                Tok::One if i < s.len() => {
                    i = (i + char_len(s[i])).min(s.len());
                    p += 1;
                    continue;
                }
                Tok::Lit(c) if i < s.len() && (s[i] == c || (fold_ascii && s[i].to_ascii_lowercase() == c)) => {
                    i += 1;
                    p += 1;
                    continue;
                }
                _ => {}
            }
        } else if i == s.len() {
            return true;
        }
        match star {
            Some((sp, si)) if si < s.len() => {
                let ni = (si + char_len(s[si])).min(s.len());
                star = Some((sp, ni));
                p = sp;
                i = ni;
            }
            _ => return false,
        }
    }
}
