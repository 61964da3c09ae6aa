//! A strict RFC 7239 `Forwarded` parser that reads a line from the right.
//!
//! The grammar (RFC 7239 section 4, with RFC 7230 sections 3.2.6 and 7):
//!
//! ```text
//! Forwarded         = 1#forwarded-element      ; elements: OWS "," OWS
//! forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//! forwarded-pair    = token "=" value
//! value             = token / quoted-string
//! quoted-string     = DQUOTE *( qdtext / quoted-pair ) DQUOTE
//! qdtext            = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
//! quoted-pair       = "\" ( HTAB / SP / VCHAR / obs-text )
//! ```
//!
//! Two leniencies, neither of which can join or split elements: optional
//! whitespace around `;` and `=`, and `:`, `[` and `]` in unquoted values, as
//! some proxies write `for=2001:db8::1` or `for=192.0.2.1:80` unquoted.
//!
//! Why from the right: everything left of what the nearest proxy appended is
//! written by the client. Read from the left, a client's unterminated quote
//! (`for=6.6.6.6;by="`) would run over the proxy's `, for=<client>` and make
//! the client's own `for=` the last element. Read from the right, the proxy's
//! elements are parsed the same whatever precedes them, and the first element
//! that is not well-formed ends the reading: nothing left of it is used.
//!
//! A quoted string is found from its closing quote by the nearest quote to
//! its left that is not escaped, that is, not preceded by an odd run of
//! backslashes (inside a quoted string every backslash starts a
//! quoted-pair). Its content is then checked left to right against the
//! grammar, so a string the two directions would read differently is
//! refused. Work is linear in the line's length.

/// A parameter's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Value<'a> {
    /// A token (or the leniently accepted unquoted address).
    Token(&'a [u8]),
    /// A quoted-string's content, its quoted-pairs still escaped.
    Quoted(&'a [u8]),
}

/// The element is not well-formed, or reaches into the cut-off part of a
/// line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

/// The last element of `line`: its `for` value (`None` if it has none, or
/// more than one), and the part of the line before the comma that precedes
/// the element (`None` if it is the first). With `cut`, `line` is the tail of
/// a longer line, and an element that may continue left of it is
/// [`Malformed`].
pub(super) fn last_element(
    line: &[u8],
    cut: bool,
) -> Result<(Option<Value<'_>>, Option<&[u8]>), Malformed> {
    let mut r = Rev {
        s: line,
        end: line.len(),
        cut,
    };
    let (mut found, mut fors) = (None, 0);
    loop {
        r.skip_ows();
        match r.peek() {
            None | Some(b',') => break,
            Some(b';') => {
                r.end -= 1;
                continue;
            }
            Some(_) => {}
        }
        let value = if r.peek() == Some(b'"') {
            Value::Quoted(r.quoted()?)
        } else {
            Value::Token(r.run(is_value_char)?)
        };
        r.skip_ows();
        if r.peek() != Some(b'=') {
            return Err(Malformed);
        }
        r.end -= 1;
        r.skip_ows();
        let name = r.run(is_tchar)?;
        if name.eq_ignore_ascii_case(b"for") {
            fors += 1;
            found = Some(value);
        }
        r.skip_ows();
        match r.peek() {
            None | Some(b',') => break,
            Some(b';') => r.end -= 1,
            Some(_) => return Err(Malformed),
        }
    }
    if r.end == 0 && cut {
        return Err(Malformed);
    }
    let before = r.end.checked_sub(1).map(|comma| &line[..comma]);
    Ok((if fors == 1 { found } else { None }, before))
}

/// A cursor that moves left: `s[..end]` is still to be read.
struct Rev<'a> {
    s: &'a [u8],
    end: usize,
    cut: bool,
}

impl<'a> Rev<'a> {
    fn peek(&self) -> Option<u8> {
        self.end.checked_sub(1).map(|i| self.s[i])
    }

    fn skip_ows(&mut self) {
        while let Some(b' ' | b'\t') = self.peek() {
            self.end -= 1;
        }
    }

    /// The non-empty run of bytes matching `pred` that ends here.
    fn run(&mut self, pred: fn(u8) -> bool) -> Result<&'a [u8], Malformed> {
        let end = self.end;
        while self.peek().is_some_and(pred) {
            self.end -= 1;
        }
        match &self.s[self.end..end] {
            [] => Err(Malformed),
            run => Ok(run),
        }
    }

    /// The quoted-string whose closing quote is the next byte; its content.
    fn quoted(&mut self) -> Result<&'a [u8], Malformed> {
        let close = self.end - 1;
        if self.escaped(close)? {
            return Err(Malformed);
        }
        let mut left = close;
        let open = loop {
            let Some(quote) = self.s[..left].iter().rposition(|&b| b == b'"') else {
                return Err(Malformed);
            };
            if !self.escaped(quote)? {
                break quote;
            }
            left = quote;
        };
        let content = &self.s[open + 1..close];
        let mut bytes = content.iter();
        while let Some(&b) = bytes.next() {
            let ok = match b {
                b'\\' => bytes.next().is_some_and(|&e| is_quoted_pair_char(e)),
                _ => is_qdtext(b),
            };
            if !ok {
                return Err(Malformed);
            }
        }
        self.end = open;
        Ok(content)
    }

    /// Whether the quote at `i` is escaped: preceded by an odd run of
    /// backslashes. Unknowable if the run may go on past a cut.
    fn escaped(&self, i: usize) -> Result<bool, Malformed> {
        let run = self.s[..i]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if run == i && self.cut {
            return Err(Malformed);
        }
        Ok(run % 2 == 1)
    }
}

/// RFC 7230 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte of an unquoted value: a `tchar`, or `:`, `[` and `]` (lenient).
fn is_value_char(b: u8) -> bool {
    is_tchar(b) || b":[]".contains(&b)
}

/// RFC 7230 `qdtext`.
fn is_qdtext(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21 | 0x23..=0x5B | 0x5D..=0x7E | 0x80..=0xFF)
}

/// The second byte of an RFC 7230 `quoted-pair`.
fn is_quoted_pair_char(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21..=0x7E | 0x80..=0xFF)
}
