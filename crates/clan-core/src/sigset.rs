//! Process set expressions for `clan sigsend` (Solaris's sigsendset): predicates over pid,
//! pgid, sid, uid, job and node combined with `and`, `or`, `not` and parentheses.
//!
//! ```text
//! expr  := term { ("or" | "||") term }
//! term  := unary { ("and" | "&&") unary }
//! unary := ("not" | "!") unary | "(" expr ")" | "all" | KEY ("=" | "==") VALUE
//! KEY   := pid | pgid | sid | uid | job | node
//! ```
//!
//! pid, pgid and sid take gpids (`30004711` or `3:4711`); uid a number or a user name (the
//! resolver given to [`parse_with`] turns names into numbers). [`Expr`]'s `Display` is a
//! canonical form that parses back to the same expression, which is what travels between
//! nodes. [`Expr::route`] tells which nodes can hold a match, so that one process or one group
//! is never broadcast.

use crate::{Gpid, JobId, NodeId};
use std::fmt;

/// What a predicate looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Pid,
    Pgid,
    Sid,
    Uid,
    Job,
    Node,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Pid => "pid",
            Key::Pgid => "pgid",
            Key::Sid => "sid",
            Key::Uid => "uid",
            Key::Job => "job",
            Key::Node => "node",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    All,
    Is(Key, u64),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

/// The attributes of one process that predicates test (pgid and sid are cluster-wide gpids).
#[derive(Debug, Clone, Copy, Default)]
pub struct Attrs {
    pub gpid: u64,
    pub pgid: u64,
    pub sid: u64,
    pub uid: u32,
    pub job: u64,
    pub node: u32,
}

/// Where the processes an expression can match live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Only on this node.
    Node(NodeId),
    /// Only among the members of this process group (found through its home node).
    Group(Gpid),
    /// Only among the members of this session.
    Session(Gpid),
    /// Anywhere: every live node evaluates it.
    All,
}

/// A parse error, with the column (1-based) of the offending token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at column {}: {}", self.column, self.message)
    }
}

impl std::error::Error for ParseError {}

impl Expr {
    /// Whether the process with `a` is in the set.
    pub fn matches(&self, a: &Attrs) -> bool {
        match self {
            Expr::All => true,
            Expr::Is(k, v) => {
                *v == match k {
                    Key::Pid => a.gpid,
                    Key::Pgid => a.pgid,
                    Key::Sid => a.sid,
                    Key::Uid => u64::from(a.uid),
                    Key::Job => a.job,
                    Key::Node => u64::from(a.node),
                }
            }
            Expr::Not(e) => !e.matches(a),
            Expr::And(l, r) => l.matches(a) && r.matches(a),
            Expr::Or(l, r) => l.matches(a) || r.matches(a),
        }
    }

    /// The narrowest place the matches can be: a conjunction is as narrow as its narrowest
    /// side (a node beats a group, a group a session); anything else is everywhere.
    pub fn route(&self) -> Route {
        fn rank(r: &Route) -> u8 {
            match r {
                Route::Node(_) => 0,
                Route::Group(_) => 1,
                Route::Session(_) => 2,
                Route::All => 3,
            }
        }
        match self {
            Expr::Is(Key::Pid, v) => {
                Gpid::from_raw(*v).map_or(Route::All, |g| Route::Node(g.node()))
            }
            Expr::Is(Key::Node, v) => u32::try_from(*v)
                .ok()
                .and_then(NodeId::new)
                .map_or(Route::All, Route::Node),
            Expr::Is(Key::Pgid, v) => Gpid::from_raw(*v).map_or(Route::All, Route::Group),
            Expr::Is(Key::Sid, v) => Gpid::from_raw(*v).map_or(Route::All, Route::Session),
            Expr::And(l, r) => {
                let (a, b) = (l.route(), r.route());
                if rank(&a) <= rank(&b) {
                    a
                } else {
                    b
                }
            }
            Expr::Or(l, r) => {
                let (a, b) = (l.route(), r.route());
                if a == b {
                    a
                } else {
                    Route::All
                }
            }
            _ => Route::All,
        }
    }

    /// Whether any predicate looks at the job (reading it costs a file per process).
    pub fn uses_job(&self) -> bool {
        match self {
            Expr::Is(Key::Job, _) => true,
            Expr::Not(e) => e.uses_job(),
            Expr::And(l, r) | Expr::Or(l, r) => l.uses_job() || r.uses_job(),
            _ => false,
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::All => write!(f, "all"),
            Expr::Is(k, v) => write!(f, "{}={v}", k.name()),
            Expr::Not(e) => write!(f, "not ({e})"),
            Expr::And(l, r) => write!(f, "({l}) and ({r})"),
            Expr::Or(l, r) => write!(f, "({l}) or ({r})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Eq,
    Not,
    And,
    Or,
    Open,
    Close,
}

fn tokens(s: &str) -> Result<Vec<(usize, Tok)>, ParseError> {
    let mut out = Vec::new();
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let col = i + 1;
        let two = |x: char| b.get(i + 1) == Some(&x);
        match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '(' => out.push((col, Tok::Open)),
            ')' => out.push((col, Tok::Close)),
            '!' => out.push((col, Tok::Not)),
            '=' => {
                if two('=') {
                    i += 1;
                }
                out.push((col, Tok::Eq));
            }
            '&' if two('&') => {
                i += 1;
                out.push((col, Tok::And));
            }
            '|' if two('|') => {
                i += 1;
                out.push((col, Tok::Or));
            }
            c if c.is_alphanumeric() || "_:.-".contains(c) => {
                let start = i;
                while i < b.len() && (b[i].is_alphanumeric() || "_:.-".contains(b[i])) {
                    i += 1;
                }
                let w: String = b[start..i].iter().collect();
                out.push((
                    col,
                    match w.as_str() {
                        "and" => Tok::And,
                        "or" => Tok::Or,
                        "not" => Tok::Not,
                        _ => Tok::Word(w),
                    },
                ));
                continue;
            }
            other => {
                return Err(ParseError {
                    column: col,
                    message: format!("unexpected character '{other}'"),
                })
            }
        }
        i += 1;
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    end: usize,
    user: &'a dyn Fn(&str) -> Option<u32>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }

    fn col(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |(c, _)| *c)
    }

    fn err<T>(&self, message: String) -> Result<T, ParseError> {
        Err(ParseError {
            column: self.col(),
            message,
        })
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "end of expression".into(),
            Some(Tok::Word(w)) => format!("'{w}'"),
            Some(Tok::Eq) => "'='".into(),
            Some(Tok::Not) => "'not'".into(),
            Some(Tok::And) => "'and'".into(),
            Some(Tok::Or) => "'or'".into(),
            Some(Tok::Open) => "'('".into(),
            Some(Tok::Close) => "')'".into(),
        }
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.term()?;
        while self.peek() == Some(&Tok::Or) {
            self.pos += 1;
            e = Expr::Or(Box::new(e), Box::new(self.term()?));
        }
        Ok(e)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.unary()?;
        while self.peek() == Some(&Tok::And) {
            self.pos += 1;
            e = Expr::And(Box::new(e), Box::new(self.unary()?));
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        match self.peek().cloned() {
            Some(Tok::Not) => {
                self.pos += 1;
                Ok(Expr::Not(Box::new(self.unary()?)))
            }
            Some(Tok::Open) => {
                self.pos += 1;
                let e = self.expr()?;
                if self.peek() != Some(&Tok::Close) {
                    return self.err(format!("expected ')', found {}", self.describe()));
                }
                self.pos += 1;
                Ok(e)
            }
            Some(Tok::Word(w)) if w == "all" => {
                self.pos += 1;
                Ok(Expr::All)
            }
            Some(Tok::Word(w)) => {
                let key = match w.as_str() {
                    "pid" => Key::Pid,
                    "pgid" => Key::Pgid,
                    "sid" => Key::Sid,
                    "uid" => Key::Uid,
                    "job" => Key::Job,
                    "node" => Key::Node,
                    _ => {
                        return self.err(format!(
                            "unknown key '{w}' (expected pid, pgid, sid, uid, job, node or all)"
                        ))
                    }
                };
                self.pos += 1;
                if self.peek() != Some(&Tok::Eq) {
                    return self.err(format!("expected '=' after {w}, found {}", self.describe()));
                }
                self.pos += 1;
                let Some(Tok::Word(v)) = self.peek().cloned() else {
                    return self.err(format!(
                        "expected a value for {w}, found {}",
                        self.describe()
                    ));
                };
                let value = match key {
                    Key::Pid | Key::Pgid | Key::Sid => v.parse::<Gpid>().ok().map(|g| g.raw()),
                    Key::Uid => v
                        .parse::<u32>()
                        .ok()
                        .or_else(|| (self.user)(&v))
                        .map(u64::from),
                    Key::Job => v.parse::<JobId>().ok().map(|j| j.raw()),
                    Key::Node => v
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| NodeId::new(n).is_some())
                        .map(u64::from),
                };
                let Some(value) = value else {
                    return self.err(format!("invalid {w} '{v}'"));
                };
                self.pos += 1;
                Ok(Expr::Is(key, value))
            }
            _ => self.err(format!("expected a predicate, found {}", self.describe())),
        }
    }
}

/// Parses an expression; user names in `uid=` are resolved with `user`.
pub fn parse_with(s: &str, user: &dyn Fn(&str) -> Option<u32>) -> Result<Expr, ParseError> {
    let toks = tokens(s)?;
    let mut p = Parser {
        toks,
        pos: 0,
        end: s.chars().count() + 1,
        user,
    };
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return p.err(format!("unexpected {}", p.describe()));
    }
    Ok(e)
}

/// Parses an expression with numeric uids only.
pub fn parse(s: &str) -> Result<Expr, ParseError> {
    parse_with(s, &|_| None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(gpid: u64, pgid: u64, uid: u32) -> Attrs {
        Attrs {
            gpid,
            pgid,
            sid: pgid,
            uid,
            job: 1_000_001,
            node: (gpid / 10_000_000) as u32,
        }
    }

    #[test]
    fn precedence_and_matching() {
        let e = parse("pgid=1:100 and not uid=0 or pid=20000007").unwrap();
        assert!(e.matches(&attrs(20000050, 10000100, 1000)));
        assert!(!e.matches(&attrs(20000050, 10000100, 0)));
        assert!(e.matches(&attrs(20000007, 5, 0)));
        let e = parse("pgid == 10000100 && (uid=0 || uid=5)").unwrap();
        assert!(e.matches(&attrs(1, 10000100, 5)));
        assert!(!e.matches(&attrs(1, 10000100, 6)));
    }

    #[test]
    fn canonical_form_round_trips() {
        for s in [
            "all",
            "not (pid=3:4711 or node=2) and job=1000001",
            "!uid=0 && sid=20000001 || pgid=2:7",
        ] {
            let e = parse(s).unwrap();
            assert_eq!(parse(&e.to_string()).unwrap(), e, "{s}");
        }
    }

    #[test]
    fn routes_single_processes_and_groups_narrowly() {
        let r = |s: &str| parse(s).unwrap().route();
        assert_eq!(r("pid=3:4711"), Route::Node(NodeId::new(3).unwrap()));
        assert_eq!(
            r("uid=0 and pgid=2:7"),
            Route::Group(Gpid::from_raw(20000007).unwrap())
        );
        assert_eq!(
            r("sid=1:1 and node=4"),
            Route::Node(NodeId::new(4).unwrap())
        );
        assert_eq!(r("pid=1:5 or pid=2:5"), Route::All);
        assert_eq!(r("not pid=1:5"), Route::All);
        assert_eq!(r("uid=0"), Route::All);
    }

    #[test]
    fn errors_point_at_the_offending_token() {
        let e = parse("pgid=1:100 and colour=red").unwrap_err();
        assert_eq!(e.column, 16);
        assert!(e.message.contains("unknown key 'colour'"), "{e}");
        let e = parse("(pid=1:5 or uid=0").unwrap_err();
        assert_eq!(e.column, 18);
        assert!(e.message.contains("expected ')'"), "{e}");
        let e = parse("pid=banana").unwrap_err();
        assert_eq!(e.column, 5);
        let e = parse("uid=0 uid=1").unwrap_err();
        assert_eq!(e.column, 7);
        assert!(parse("uid=0 $").unwrap_err().message.contains("'$'"));
        assert!(parse("").is_err());
        assert!(parse("node=0").is_err());
    }

    #[test]
    fn user_names_resolve() {
        let e = parse_with("uid=alice", &|n| (n == "alice").then_some(1001)).unwrap();
        assert_eq!(e, Expr::Is(Key::Uid, 1001));
        assert!(parse("uid=alice").is_err());
    }
}
