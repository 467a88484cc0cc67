//! Text -> [`PExpr`]: sqlparser (PostgreSQL dialect) reads one scalar expression, then every
//! construct is checked and translated into the small tree the binder understands. Everything that
//! is not a row-level, immutable, evaluable expression is refused here with its SQLSTATE.

use sqlparser::ast::{
    BinaryOperator, CastKind, CeilFloorKind, CharacterLength, DataType, DateTimeField, DuplicateTreatment,
    ExactNumberInfo, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, InTarget, ObjectName,
    ObjectNamePart, TimezoneInfo, TrimWhereField, UnaryOperator, Value as SqlValue,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer, Whitespace};

use super::num::{parse_numeric, NumErr, Numeric};
use super::val::{Target, Ty};
use crate::error::{CdcError, CdcResult, ErrorKind};

/// Longest expression text accepted.
pub(crate) const MAX_TEXT: usize = 16 * 1024;
/// Deepest nesting accepted (AND/OR chains are flat and do not count). Every stage (parse, bind,
/// evaluate) recurses over the tree, so this bounds their stack use.
pub(crate) const MAX_DEPTH: usize = 64;
/// sqlparser's own recursion limit (parentheses, function calls, NOT, CASE, operator precedence
/// levels). Its frames are large (tens of KB each in debug builds): 24 levels stay well within a
/// 2 MB thread stack, and are far more than a filter needs.
const PARSER_DEPTH: usize = 24;
/// Subtrees of at most this many nodes are printed with sqlparser's (recursive) Display.
const SHALLOW: usize = 200;

/// A literal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lit {
    Int(i64),
    Num(Numeric),
    /// A numeric literal beyond what arithmetic handles (`1e300`): usable in comparisons only.
    BigNum(String),
    Str(String),
    Bool(bool),
    Null,
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    /// The operator with its operands swapped (`5 < x` is `x > 5`).
    pub(crate) fn mirror(self) -> CmpOp {
        match self {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            x => x,
        }
    }

    #[inline]
    pub(crate) fn test(self, o: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            CmpOp::Eq => o == Equal,
            CmpOp::Ne => o != Equal,
            CmpOp::Lt => o == Less,
            CmpOp::Le => o != Greater,
            CmpOp::Gt => o == Greater,
            CmpOp::Ge => o != Less,
        }
    }
}

/// Arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

impl ArOp {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            ArOp::Add => "+",
            ArOp::Sub => "-",
            ArOp::Mul => "*",
            ArOp::Div => "/",
            ArOp::Mod => "%",
        }
    }
}

/// The functions expressions may call (all immutable in PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Abs,
    Round,
    Floor,
    Ceil,
    Trunc,
    Sign,
    Mod,
    Lower,
    Upper,
    Length,
    OctetLength,
    Btrim,
    Ltrim,
    Rtrim,
    Substr,
    Coalesce,
    Nullif,
    Greatest,
    Least,
    StartsWith,
    Strpos,
    Replace,
    Left,
    Right,
}

/// (name, function, min args, max args)
const FUNCTIONS: &[(&str, Func, usize, usize)] = &[
    ("abs", Func::Abs, 1, 1),
    ("round", Func::Round, 1, 2),
    ("floor", Func::Floor, 1, 1),
    ("ceil", Func::Ceil, 1, 1),
    ("ceiling", Func::Ceil, 1, 1),
    ("trunc", Func::Trunc, 1, 2),
    ("sign", Func::Sign, 1, 1),
    ("mod", Func::Mod, 2, 2),
    ("lower", Func::Lower, 1, 1),
    ("upper", Func::Upper, 1, 1),
    ("length", Func::Length, 1, 1),
    ("char_length", Func::Length, 1, 1),
    ("character_length", Func::Length, 1, 1),
    ("octet_length", Func::OctetLength, 1, 1),
    ("btrim", Func::Btrim, 1, 2),
    ("ltrim", Func::Ltrim, 1, 2),
    ("rtrim", Func::Rtrim, 1, 2),
    ("substr", Func::Substr, 2, 3),
    ("substring", Func::Substr, 2, 3),
    ("coalesce", Func::Coalesce, 1, usize::MAX),
    ("nullif", Func::Nullif, 2, 2),
    ("greatest", Func::Greatest, 1, usize::MAX),
    ("least", Func::Least, 1, usize::MAX),
    ("starts_with", Func::StartsWith, 2, 2),
    ("strpos", Func::Strpos, 2, 2),
    ("replace", Func::Replace, 3, 3),
    ("left", Func::Left, 2, 2),
    ("right", Func::Right, 2, 2),
];

/// The names of the functions expressions may call, for hints.
pub(crate) fn function_names() -> String {
    let mut names: Vec<&str> = FUNCTIONS.iter().map(|f| f.0).collect();
    names.push("position");
    names.push("trim");
    names.sort_unstable();
    names.join(", ")
}

const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
    "every",
    "bit_and",
    "bit_or",
    "bit_xor",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "json_agg",
    "jsonb_agg",
    "json_object_agg",
    "jsonb_object_agg",
    "xmlagg",
    "corr",
    "covar_pop",
    "covar_samp",
    "regr_avgx",
    "regr_avgy",
    "regr_count",
    "regr_intercept",
    "regr_r2",
    "regr_slope",
    "regr_sxx",
    "regr_sxy",
    "regr_syy",
    "mode",
    "percentile_cont",
    "percentile_disc",
    "any_value",
    "range_agg",
    "range_intersect_agg",
];

const WINDOW_FUNCTIONS: &[&str] = &[
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
];

/// Volatile or stable functions people are likely to try.
const NOT_IMMUTABLE: &[&str] = &[
    "random",
    "random_normal",
    "setseed",
    "now",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtime",
    "localtimestamp",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "nextval",
    "currval",
    "setval",
    "lastval",
    "gen_random_uuid",
    "uuid_generate_v1",
    "uuid_generate_v1mc",
    "uuid_generate_v4",
    "current_user",
    "session_user",
    "user",
    "current_role",
    "current_catalog",
    "current_schema",
    "current_schemas",
    "current_database",
    "current_setting",
    "set_config",
    "version",
    "inet_client_addr",
    "inet_client_port",
    "inet_server_addr",
    "inet_server_port",
    "to_char",
    "to_date",
    "to_timestamp",
    "age",
    "concat",
    "concat_ws",
    "format",
    "query_to_xml",
];

const NOT_IMMUTABLE_PREFIXES: &[&str] = &["pg_", "txid_", "lo_", "dblink"];

/// One node of the parsed expression, with its text for messages.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PExpr {
    pub kind: PKind,
    /// The fragment as sqlparser prints it (for error messages).
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PKind {
    /// A column, by its name as PostgreSQL folds it.
    Col(String),
    Lit(Lit),
    Not(Box<PExpr>),
    And(Vec<PExpr>),
    Or(Vec<PExpr>),
    Neg(Box<PExpr>),
    Plus(Box<PExpr>),
    Cmp(CmpOp, Box<PExpr>, Box<PExpr>),
    Arith(ArOp, Box<PExpr>, Box<PExpr>),
    Concat(Box<PExpr>, Box<PExpr>),
    IsNull(Box<PExpr>, bool),
    /// `IS [NOT] TRUE / FALSE / UNKNOWN` (None is UNKNOWN).
    IsBool(Box<PExpr>, Option<bool>, bool),
    /// `IS [NOT] DISTINCT FROM`; the flag is NOT.
    Distinct(Box<PExpr>, Box<PExpr>, bool),
    In(Box<PExpr>, Vec<PExpr>, bool),
    Between(Box<PExpr>, Box<PExpr>, Box<PExpr>, bool),
    Like {
        arg: Box<PExpr>,
        pat: Box<PExpr>,
        /// The escape character; None turns escaping off (`ESCAPE ''`).
        escape: Option<char>,
        ci: bool,
        negated: bool,
    },
    Case {
        operand: Option<Box<PExpr>>,
        whens: Vec<(PExpr, PExpr)>,
        else_: Option<Box<PExpr>>,
    },
    Cast(Box<PExpr>, Target),
    Func(Func, Vec<PExpr>),
}

impl PExpr {
    /// Column names referenced, in order of first appearance.
    pub(crate) fn collect_columns(&self, out: &mut Vec<String>) {
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match &e.kind {
                PKind::Col(c) => {
                    if !out.contains(c) {
                        out.push(c.clone());
                    }
                }
                PKind::Lit(_) => {}
                PKind::Not(a) | PKind::Neg(a) | PKind::Plus(a) | PKind::IsNull(a, _) | PKind::IsBool(a, ..) => {
                    stack.push(a)
                }
                PKind::Cast(a, _) => stack.push(a),
                PKind::And(v) | PKind::Or(v) | PKind::Func(_, v) => stack.extend(v.iter().rev()),
                PKind::Cmp(_, a, b) | PKind::Arith(_, a, b) | PKind::Concat(a, b) | PKind::Distinct(a, b, _) => {
                    stack.push(b);
                    stack.push(a);
                }
                PKind::In(a, v, _) => {
                    stack.extend(v.iter().rev());
                    stack.push(a);
                }
                PKind::Between(a, b, c, _) => {
                    stack.push(c);
                    stack.push(b);
                    stack.push(a);
                }
                PKind::Like { arg, pat, .. } => {
                    stack.push(pat);
                    stack.push(arg);
                }
                PKind::Case { operand, whens, else_ } => {
                    if let Some(e) = else_ {
                        stack.push(e);
                    }
                    for (w, t) in whens.iter().rev() {
                        stack.push(t);
                        stack.push(w);
                    }
                    if let Some(o) = operand {
                        stack.push(o);
                    }
                }
            }
        }
    }
}

fn err(kind: ErrorKind, msg: impl Into<String>) -> CdcError {
    CdcError::new(kind, msg)
}

/// The fragment for a message, shortened when long.
pub(crate) fn frag(e: &impl std::fmt::Display) -> String {
    let s = e.to_string();
    if s.chars().count() > 120 {
        let cut: String = s.chars().take(117).collect();
        format!("{cut}...")
    } else {
        s
    }
}

fn not_supported(ctx: &str, what: &str, text: &str) -> CdcError {
    err(ErrorKind::FeatureNotSupported, format!("{what} not supported in {ctx}: {text}"))
}

/// The parse result: the tree, and the top-level OR branches with their source text.
pub(crate) struct ParseOut {
    pub root: PExpr,
    pub branches: Vec<(PExpr, String)>,
}

/// Parses one scalar SQL expression.
pub(crate) fn parse_text(text: &str, ctx: &'static str) -> CdcResult<ParseOut> {
    if text.len() > MAX_TEXT {
        return Err(err(
            ErrorKind::StatementTooComplex,
            format!("expression is too long ({} bytes, at most {MAX_TEXT})", text.len()),
        ));
    }
    if text.trim().is_empty() {
        return Err(err(ErrorKind::SyntaxError, "expression is empty"));
    }
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, text)
        .tokenize_with_location()
        .map_err(|e| err(ErrorKind::SyntaxError, format!("syntax error in expression \"{}\": {e}", frag(&text))))?;
    if tokens.iter().any(|t| {
        matches!(t.token, Token::Whitespace(Whitespace::SingleLineComment { .. } | Whitespace::MultiLineComment(_)))
    }) {
        return Err(err(ErrorKind::SyntaxError, format!("comments are not allowed in an expression: {}", frag(&text)))
            .hint("Remove the -- or /* */ comment: the expression is stored and may be embedded in other SQL."));
    }
    let expr = parse_one(&dialect, tokens.clone(), text)?;
    let root_sql = strip_nested(&expr);
    let disjuncts = flatten(root_sql, &BinaryOperator::Or);
    let small = tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_))).count() <= SHALLOW;
    let mut conv = Conv { depth: 0, small, ctx };
    let mut parts = Vec::with_capacity(disjuncts.len());
    for d in &disjuncts {
        parts.push(conv.expr(d)?);
    }
    let texts = branch_texts(&dialect, text, &tokens, &disjuncts);
    let root = if parts.len() == 1 {
        parts[0].clone()
    } else {
        PExpr { kind: PKind::Or(parts.clone()), text: frag(&text.trim()) }
    };
    let branches = parts.into_iter().zip(texts).collect();
    Ok(ParseOut { root, branches })
}

fn parse_one(dialect: &PostgreSqlDialect, tokens: Vec<TokenWithSpan>, text: &str) -> CdcResult<Expr> {
    let mut parser = Parser::new(dialect).with_recursion_limit(PARSER_DEPTH).with_tokens_with_locations(tokens);
    let expr = parser.parse_expr().map_err(|e| match e {
        ParserError::RecursionLimitExceeded => {
            err(ErrorKind::StatementTooComplex, format!("expression is too deeply nested: {}", frag(&text)))
        }
        ParserError::TokenizerError(m) | ParserError::ParserError(m) => {
            err(ErrorKind::SyntaxError, format!("syntax error in expression \"{}\": {m}", frag(&text)))
        }
    })?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        let e =
            err(ErrorKind::SyntaxError, format!("syntax error at or near \"{}\" in \"{}\"", next.token, frag(&text)))
                .detail("An expression is a single SQL expression: nothing may follow it.");
        return Err(if next.token == Token::SemiColon {
            e.hint("Remove the semicolon: statements are not accepted, only one expression.")
        } else {
            e
        });
    }
    Ok(expr)
}

fn strip_nested(mut e: &Expr) -> &Expr {
    while let Expr::Nested(inner) = e {
        e = inner;
    }
    e
}

/// The operands of an unparenthesised chain of `op` (AND or OR), left to right, without recursion.
fn flatten<'a>(e: &'a Expr, op: &BinaryOperator) -> Vec<&'a Expr> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(x) = stack.pop() {
        match x {
            Expr::BinaryOp { left, op: o, right } if o == op => {
                stack.push(right);
                stack.push(left);
            }
            _ => out.push(x),
        }
    }
    out
}

/// Byte offset of a (line, column) location; columns count characters.
fn offset(text: &str, loc: Location) -> Option<usize> {
    let mut line = 1u64;
    let mut col = 1u64;
    for (i, c) in text.char_indices() {
        if line == loc.line && col == loc.column {
            return Some(i);
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line == loc.line && col == loc.column).then_some(text.len())
}

/// The source text of each top-level OR branch: split at OR outside parentheses and CASE, then
/// checked by parsing each piece again; falls back to sqlparser's rendering of the branch.
fn branch_texts(dialect: &PostgreSqlDialect, text: &str, tokens: &[TokenWithSpan], parts: &[&Expr]) -> Vec<String> {
    let fallback = || {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| if shallow(p, SHALLOW) { p.to_string() } else { format!("branch {}", i + 1) })
            .collect::<Vec<_>>()
    };
    if parts.len() == 1 {
        return vec![text.trim().to_string()];
    }
    let mut toks: Vec<&TokenWithSpan> =
        tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF)).collect();
    // Strip parentheses around the whole expression.
    while toks.len() >= 2 && toks[0].token == Token::LParen && matching_close(&toks) == Some(toks.len() - 1) {
        toks = toks[1..toks.len() - 1].to_vec();
    }
    let mut segs: Vec<(usize, usize)> = Vec::new();
    let mut depth = 0i64;
    let mut start = 0usize;
    for (i, t) in toks.iter().enumerate() {
        match &t.token {
            Token::LParen | Token::LBracket => depth += 1,
            Token::RParen | Token::RBracket => depth -= 1,
            Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("case") => depth += 1,
            Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("end") => depth -= 1,
            Token::Word(w) if depth == 0 && w.quote_style.is_none() && w.value.eq_ignore_ascii_case("or") => {
                segs.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
    }
    segs.push((start, toks.len()));
    if segs.len() != parts.len() {
        return fallback();
    }
    let mut out = Vec::with_capacity(segs.len());
    for ((a, b), part) in segs.into_iter().zip(parts) {
        if a >= b {
            return fallback();
        }
        let (Some(s), Some(e)) = (offset(text, toks[a].span.start), offset(text, toks[b - 1].span.end)) else {
            return fallback();
        };
        let Some(piece) = text.get(s..e) else { return fallback() };
        if !shallow(part, SHALLOW) {
            // Too large to compare (recursively) with a second parse: the split is trusted.
            out.push(piece.to_string());
            continue;
        }
        let again = Tokenizer::new(dialect, piece).tokenize_with_location().ok().and_then(|t| {
            Parser::new(dialect).with_recursion_limit(PARSER_DEPTH).with_tokens_with_locations(t).parse_expr().ok()
        });
        if again.as_ref() != Some(*part) {
            return fallback();
        }
        out.push(piece.to_string());
    }
    out
}

fn matching_close(toks: &[&TokenWithSpan]) -> Option<usize> {
    let mut depth = 0i64;
    for (i, t) in toks.iter().enumerate() {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `e` has at most `budget` nodes, counting only node kinds whose children are known
/// here (any other kind with children counts as large). Iterative.
fn shallow(e: &Expr, budget: usize) -> bool {
    let mut stack = vec![e];
    let mut n = 0;
    while let Some(x) = stack.pop() {
        n += 1;
        if n > budget {
            return false;
        }
        match x {
            Expr::Identifier(_)
            | Expr::CompoundIdentifier(_)
            | Expr::Value(_)
            | Expr::TypedString(_)
            | Expr::Wildcard(_)
            | Expr::QualifiedWildcard(..) => {}
            Expr::Nested(a)
            | Expr::UnaryOp { expr: a, .. }
            | Expr::IsNull(a)
            | Expr::IsNotNull(a)
            | Expr::IsTrue(a)
            | Expr::IsNotTrue(a)
            | Expr::IsFalse(a)
            | Expr::IsNotFalse(a)
            | Expr::IsUnknown(a)
            | Expr::IsNotUnknown(a)
            | Expr::Cast { expr: a, .. }
            | Expr::Collate { expr: a, .. }
            | Expr::Ceil { expr: a, .. }
            | Expr::Floor { expr: a, .. }
            | Expr::Extract { expr: a, .. } => stack.push(a),
            Expr::BinaryOp { left: a, right: b, .. }
            | Expr::IsDistinctFrom(a, b)
            | Expr::IsNotDistinctFrom(a, b)
            | Expr::AnyOp { left: a, right: b, .. }
            | Expr::AllOp { left: a, right: b, .. }
            | Expr::Position { expr: a, r#in: b }
            | Expr::AtTimeZone { timestamp: a, time_zone: b } => {
                stack.push(a);
                stack.push(b);
            }
            Expr::In { expr, target: InTarget::List(l), .. } => {
                stack.push(expr);
                stack.extend(l.iter());
            }
            Expr::Between { expr, low, high, .. } => stack.extend([&**expr, &**low, &**high]),
            Expr::Like { expr, pattern, escape_char, .. }
            | Expr::ILike { expr, pattern, escape_char, .. }
            | Expr::SimilarTo { expr, pattern, escape_char, .. } => {
                stack.extend([&**expr, &**pattern]);
                stack.extend(escape_char.as_deref());
            }
            Expr::Case { operand, conditions, else_result, .. } => {
                stack.extend(operand.as_deref());
                stack.extend(else_result.as_deref());
                for c in conditions {
                    stack.push(&c.condition);
                    stack.push(&c.result);
                }
            }
            Expr::Substring { expr, substring_from, substring_for, .. } => {
                stack.push(expr);
                stack.extend(substring_from.as_deref());
                stack.extend(substring_for.as_deref());
            }
            Expr::Trim { expr, trim_what, trim_characters, .. } => {
                stack.push(expr);
                stack.extend(trim_what.as_deref());
                stack.extend(trim_characters.iter().flatten());
            }
            Expr::Function(f) => {
                if f.over.is_some() || !f.within_group.is_empty() {
                    return false;
                }
                stack.extend(f.filter.as_deref());
                match &f.args {
                    FunctionArguments::None => {}
                    FunctionArguments::Subquery(_) => return false,
                    FunctionArguments::List(l) => {
                        if !l.clauses.is_empty() {
                            return false;
                        }
                        for a in &l.args {
                            match a {
                                FunctionArg::Unnamed(FunctionArgExpr::Expr(x))
                                | FunctionArg::Named { arg: FunctionArgExpr::Expr(x), .. } => stack.push(x),
                                FunctionArg::Unnamed(_) | FunctionArg::Named { .. } => {}
                                FunctionArg::ExprNamed { .. } => return false,
                            }
                        }
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

struct Conv {
    depth: usize,
    /// The whole expression has so few tokens that printing any part of it is cheap.
    small: bool,
    /// "a filter expression" or "a computed column expression", for messages.
    ctx: &'static str,
}

fn fold_ident(i: &sqlparser::ast::Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_ascii_lowercase()
    }
}

fn lit_number(s: &str, text: &str) -> CdcResult<Lit> {
    if !s.contains(['.', 'e', 'E']) {
        if let Ok(i) = s.parse::<i64>() {
            return Ok(Lit::Int(i));
        }
    }
    match parse_numeric(s.as_bytes()) {
        Ok(n) => Ok(Lit::Num(n)),
        Err(NumErr::Overflow) => Ok(Lit::BigNum(s.to_string())),
        Err(NumErr::Syntax) => Err(err(ErrorKind::SyntaxError, format!("invalid number {text}"))),
    }
}

/// `name` of a function or type, lower-cased unless quoted; with its schema when qualified.
fn object_name(n: &ObjectName) -> (Option<String>, String) {
    let parts: Vec<String> =
        n.0.iter()
            .map(|p| match p {
                ObjectNamePart::Identifier(i) => fold_ident(i),
                other => other.to_string(),
            })
            .collect();
    match parts.as_slice() {
        [one] => (None, one.clone()),
        [.., schema, name] => (Some(schema.clone()), name.clone()),
        [] => (None, String::new()),
    }
}

fn typmod_len(l: &Option<CharacterLength>) -> Option<u32> {
    match l {
        Some(CharacterLength::IntegerLength { length, .. }) => Some((*length).min(u64::from(u32::MAX)) as u32),
        _ => None,
    }
}

/// The cast target for a type name.
fn target(ctx: &str, dt: &DataType, text: &str) -> CdcResult<Target> {
    use DataType as D;
    let int = |bits| Ok(Target { int_bits: bits, ..Target::plain(Ty::Int) });
    let numeric = |info: &ExactNumberInfo| -> CdcResult<Target> {
        let typmod = match info {
            ExactNumberInfo::None => None,
            ExactNumberInfo::Precision(p) => Some((*p, 0)),
            ExactNumberInfo::PrecisionAndScale(p, s) => {
                if *s < 0 || *s as u64 > *p {
                    return Err(not_supported(ctx, "a numeric scale that is negative or above the precision is", text));
                }
                Some((*p, *s as u64))
            }
        };
        if let Some((p, _)) = typmod {
            if !(1..=1000).contains(&p) {
                return Err(err(
                    ErrorKind::InvalidParameter,
                    format!("NUMERIC precision {p} must be between 1 and 1000: {text}"),
                ));
            }
        }
        Ok(Target { typmod: typmod.map(|(p, s)| (p as u32, s as u32)), ..Target::plain(Ty::Numeric) })
    };
    match dt {
        D::SmallInt(_) | D::Int2(_) => int(16),
        D::Int(_) | D::Integer(_) | D::Int4(_) => int(32),
        D::BigInt(_) | D::Int8(_) => int(64),
        D::Numeric(i) | D::Decimal(i) | D::Dec(i) => numeric(i),
        D::Float(_) | D::Float4 | D::Real | D::Float8 | D::Double(_) | D::DoublePrecision => {
            Ok(Target::plain(Ty::Float))
        }
        D::Text | D::String(None) => Ok(Target::plain(Ty::Text)),
        D::Varchar(l) | D::CharacterVarying(l) | D::CharVarying(l) => {
            Ok(Target { len: typmod_len(l), ..Target::plain(Ty::Text) })
        }
        D::Bool | D::Boolean => Ok(Target::plain(Ty::Bool)),
        D::Date => Ok(Target::plain(Ty::Date)),
        D::Timestamp(_, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => Ok(Target::plain(Ty::TimestampTz)),
        D::Timestamp(_, _) => Ok(Target::plain(Ty::Timestamp)),
        D::Custom(name, mods) if mods.is_empty() => {
            let (_, n) = object_name(name);
            match n.as_str() {
                "int2" => int(16),
                "int4" => int(32),
                "int8" => int(64),
                "float4" | "float8" => Ok(Target::plain(Ty::Float)),
                "timestamptz" => Ok(Target::plain(Ty::TimestampTz)),
                "bool" => Ok(Target::plain(Ty::Bool)),
                "text" | "varchar" => Ok(Target::plain(Ty::Text)),
                _ => Err(err(ErrorKind::FeatureNotSupported, format!("type {dt} is not supported in {ctx}: {text}"))
                    .hint(
                        "Casts can go to smallint, integer, bigint, numeric, double precision, text, varchar, \
                     boolean, date, timestamp and timestamptz.",
                    )),
            }
        }
        _ => Err(err(ErrorKind::FeatureNotSupported, format!("type {dt} is not supported in {ctx}: {text}")).hint(
            "Casts can go to smallint, integer, bigint, numeric, double precision, text, varchar, boolean, date, \
             timestamp and timestamptz.",
        )),
    }
}

fn lit_expr(kind: Lit, text: String) -> PExpr {
    PExpr { kind: PKind::Lit(kind), text }
}

impl Conv {
    /// The fragment for a message. sqlparser prints (and compares) recursively, with large frames:
    /// only subtrees known to be small are printed.
    fn frag(&self, e: &Expr) -> String {
        if self.small || shallow(e, SHALLOW) {
            frag(e)
        } else {
            "(an expression too large to quote)".to_string()
        }
    }

    fn ns(&self, what: &str, e: &Expr) -> CdcError {
        not_supported(self.ctx, what, &self.frag(e))
    }

    fn sq(&self, e: &Expr) -> CdcError {
        subquery(self.ctx, &self.frag(e))
    }

    fn expr(&mut self, e: &Expr) -> CdcResult<PExpr> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(err(
                ErrorKind::StatementTooComplex,
                format!("expression is too deeply nested (more than {MAX_DEPTH} levels)"),
            ));
        }
        let r = self.expr_inner(e);
        self.depth -= 1;
        r
    }

    fn boxed(&mut self, e: &Expr) -> CdcResult<Box<PExpr>> {
        self.expr(e).map(Box::new)
    }

    /// Dispatches to one small method per construct: this is the recursive path, and sqlparser's
    /// Expr is large, so keeping each frame small keeps deep expressions within the stack.
    fn expr_inner(&mut self, e: &Expr) -> CdcResult<PExpr> {
        if let Expr::Nested(inner) = e {
            return self.expr(inner);
        }
        let text = self.frag(e);
        let kind = match e {
            Expr::BinaryOp { .. } => self.binary(e, &text)?,
            Expr::UnaryOp { .. } => self.unary(e, &text)?,
            Expr::IsNull(_)
            | Expr::IsNotNull(_)
            | Expr::IsTrue(_)
            | Expr::IsNotTrue(_)
            | Expr::IsFalse(_)
            | Expr::IsNotFalse(_)
            | Expr::IsUnknown(_)
            | Expr::IsNotUnknown(_)
            | Expr::IsDistinctFrom(..)
            | Expr::IsNotDistinctFrom(..) => self.is_predicate(e)?,
            Expr::In { .. } | Expr::Between { .. } => self.in_between(e)?,
            Expr::Like { negated, any, expr, pattern, escape_char } => {
                self.like(e, *negated, *any, expr, pattern, escape_char.as_deref(), false)?
            }
            Expr::ILike { negated, any, expr, pattern, escape_char } => {
                self.like(e, *negated, *any, expr, pattern, escape_char.as_deref(), true)?
            }
            Expr::Case { .. } => self.case(e)?,
            Expr::Cast { .. } | Expr::TypedString(_) => self.cast(e, &text)?,
            Expr::Ceil { .. }
            | Expr::Floor { .. }
            | Expr::Position { .. }
            | Expr::Substring { .. }
            | Expr::Trim { .. } => self.special_function(e)?,
            Expr::Function(f) => self.function(e, f)?,
            _ => self.leaf(e, &text)?,
        };
        Ok(PExpr { kind, text })
    }

    #[inline(never)]
    fn leaf(&mut self, e: &Expr, text: &str) -> CdcResult<PKind> {
        Ok(match e {
            Expr::Identifier(i) => PKind::Col(fold_ident(i)),
            Expr::CompoundIdentifier(parts) => {
                let table: Vec<String> = parts[..parts.len().saturating_sub(1)].iter().map(|p| p.to_string()).collect();
                let col = parts.last().map(fold_ident).unwrap_or_default();
                return Err(err(
                    ErrorKind::UndefinedTable,
                    format!("missing FROM-clause entry for table \"{}\": {text}", table.join(".")),
                )
                .hint(format!(
                    "An expression sees only the columns of its own table; write the column name alone ({col})."
                )));
            }
            Expr::Value(v) => PKind::Lit(match &v.value {
                SqlValue::Number(s, _) => lit_number(s, text)?,
                SqlValue::SingleQuotedString(s)
                | SqlValue::EscapedStringLiteral(s)
                | SqlValue::UnicodeStringLiteral(s)
                | SqlValue::NationalStringLiteral(s) => Lit::Str(s.clone()),
                SqlValue::DollarQuotedString(d) => Lit::Str(d.value.clone()),
                SqlValue::Boolean(b) => Lit::Bool(*b),
                SqlValue::Null => Lit::Null,
                SqlValue::Placeholder(p) => {
                    return Err(err(ErrorKind::UndefinedParameter, format!("there is no parameter {p}"))
                        .hint("Expressions take no parameters: write the value as a literal."))
                }
                _ => return Err(self.ns("this kind of literal is", e)),
            }),
            Expr::SimilarTo { .. } | Expr::RLike { .. } => {
                return Err(self.ns("regular expressions are", e).hint("Use LIKE or ILIKE with % and _."))
            }
            Expr::Exists { .. } | Expr::Subquery(_) => return Err(self.sq(e)),
            Expr::AnyOp { .. } | Expr::AllOp { .. } => {
                return Err(self.ns("ANY / ALL are", e).hint("Use IN (...) or NOT IN (...) with a list."))
            }
            Expr::Interval(_) => return Err(self.ns("intervals are", e)),
            Expr::AtTimeZone { .. } => return Err(self.ns("AT TIME ZONE is", e)),
            Expr::Extract { .. } => return Err(self.ns("EXTRACT is", e)),
            Expr::Collate { .. } => return Err(self.ns("COLLATE is", e)),
            Expr::Array(_) => return Err(self.ns("arrays are", e)),
            Expr::Wildcard(_) | Expr::QualifiedWildcard(..) => {
                return Err(err(ErrorKind::SyntaxError, format!("* is not an expression: {text}")))
            }
            _ => return Err(self.ns("this construct is", e)),
        })
    }

    #[inline(never)]
    fn unary(&mut self, e: &Expr, text: &str) -> CdcResult<PKind> {
        let Expr::UnaryOp { op, expr } = e else { return Err(self.ns("this construct is", e)) };
        Ok(match op {
            UnaryOperator::Not => PKind::Not(self.boxed(expr)?),
            UnaryOperator::Minus => {
                if let Expr::Value(v) = strip_nested(expr) {
                    if let SqlValue::Number(s, _) = &v.value {
                        return Ok(PKind::Lit(lit_number(&format!("-{s}"), text)?));
                    }
                }
                PKind::Neg(self.boxed(expr)?)
            }
            UnaryOperator::Plus => PKind::Plus(self.boxed(expr)?),
            _ => return Err(self.ns(&format!("operator {op} is"), e)),
        })
    }

    #[inline(never)]
    fn binary(&mut self, e: &Expr, _text: &str) -> CdcResult<PKind> {
        let Expr::BinaryOp { left, op, right } = e else { return Err(self.ns("this construct is", e)) };
        if matches!(op, BinaryOperator::And | BinaryOperator::Or) {
            let items = flatten(e, op);
            let mut v = Vec::with_capacity(items.len());
            for x in items {
                v.push(self.expr(x)?);
            }
            return Ok(if *op == BinaryOperator::And { PKind::And(v) } else { PKind::Or(v) });
        }
        let kind = |l, r| -> Option<PKind> {
            Some(match op {
                BinaryOperator::Eq => PKind::Cmp(CmpOp::Eq, l, r),
                BinaryOperator::NotEq => PKind::Cmp(CmpOp::Ne, l, r),
                BinaryOperator::Lt => PKind::Cmp(CmpOp::Lt, l, r),
                BinaryOperator::LtEq => PKind::Cmp(CmpOp::Le, l, r),
                BinaryOperator::Gt => PKind::Cmp(CmpOp::Gt, l, r),
                BinaryOperator::GtEq => PKind::Cmp(CmpOp::Ge, l, r),
                BinaryOperator::Plus => PKind::Arith(ArOp::Add, l, r),
                BinaryOperator::Minus => PKind::Arith(ArOp::Sub, l, r),
                BinaryOperator::Multiply => PKind::Arith(ArOp::Mul, l, r),
                BinaryOperator::Divide => PKind::Arith(ArOp::Div, l, r),
                BinaryOperator::Modulo => PKind::Arith(ArOp::Mod, l, r),
                BinaryOperator::StringConcat => PKind::Concat(l, r),
                _ => return None,
            })
        };
        if matches!(
            op,
            BinaryOperator::PGRegexMatch
                | BinaryOperator::PGRegexIMatch
                | BinaryOperator::PGRegexNotMatch
                | BinaryOperator::PGRegexNotIMatch
        ) {
            return Err(self.ns("regular expressions are", e).hint("Use LIKE or ILIKE with % and _."));
        }
        let l = self.boxed(left)?;
        let r = self.boxed(right)?;
        match kind(l, r) {
            Some(k) => Ok(k),
            None => Err(self.ns(&format!("operator {op} is"), e)),
        }
    }

    #[inline(never)]
    fn is_predicate(&mut self, e: &Expr) -> CdcResult<PKind> {
        Ok(match e {
            Expr::IsNull(a) => PKind::IsNull(self.boxed(a)?, false),
            Expr::IsNotNull(a) => PKind::IsNull(self.boxed(a)?, true),
            Expr::IsTrue(a) => PKind::IsBool(self.boxed(a)?, Some(true), false),
            Expr::IsNotTrue(a) => PKind::IsBool(self.boxed(a)?, Some(true), true),
            Expr::IsFalse(a) => PKind::IsBool(self.boxed(a)?, Some(false), false),
            Expr::IsNotFalse(a) => PKind::IsBool(self.boxed(a)?, Some(false), true),
            Expr::IsUnknown(a) => PKind::IsBool(self.boxed(a)?, None, false),
            Expr::IsNotUnknown(a) => PKind::IsBool(self.boxed(a)?, None, true),
            Expr::IsDistinctFrom(a, b) => PKind::Distinct(self.boxed(a)?, self.boxed(b)?, false),
            Expr::IsNotDistinctFrom(a, b) => PKind::Distinct(self.boxed(a)?, self.boxed(b)?, true),
            _ => return Err(self.ns("this construct is", e)),
        })
    }

    #[inline(never)]
    fn in_between(&mut self, e: &Expr) -> CdcResult<PKind> {
        Ok(match e {
            Expr::In { expr, target, negated, .. } => match target {
                InTarget::List(list) => {
                    let a = self.boxed(expr)?;
                    let mut v = Vec::with_capacity(list.len());
                    for x in list {
                        v.push(self.expr(x)?);
                    }
                    PKind::In(a, v, *negated)
                }
                InTarget::Subquery(_) => return Err(self.sq(e)),
                _ => return Err(self.ns("this form of IN is", e)),
            },
            Expr::Between { expr, negated, low, high } => {
                PKind::Between(self.boxed(expr)?, self.boxed(low)?, self.boxed(high)?, *negated)
            }
            _ => return Err(self.ns("this construct is", e)),
        })
    }

    #[inline(never)]
    fn case(&mut self, e: &Expr) -> CdcResult<PKind> {
        let Expr::Case { operand, conditions, else_result, .. } = e else {
            return Err(self.ns("this construct is", e));
        };
        let operand = match operand {
            Some(o) => Some(self.boxed(o)?),
            None => None,
        };
        let mut whens = Vec::with_capacity(conditions.len());
        for c in conditions {
            whens.push((self.expr(&c.condition)?, self.expr(&c.result)?));
        }
        let else_ = match else_result {
            Some(x) => Some(self.boxed(x)?),
            None => None,
        };
        Ok(PKind::Case { operand, whens, else_ })
    }

    #[inline(never)]
    fn cast(&mut self, e: &Expr, text: &str) -> CdcResult<PKind> {
        match e {
            Expr::Cast { kind, expr, data_type, format } => {
                if !matches!(kind, CastKind::Cast | CastKind::DoubleColon) || format.is_some() {
                    return Err(self.ns("this form of CAST is", e));
                }
                let t = target(self.ctx, data_type, text)?;
                Ok(PKind::Cast(self.boxed(expr)?, t))
            }
            Expr::TypedString(ts) => {
                let t = target(self.ctx, &ts.data_type, text)?;
                let s = match &ts.value.value {
                    SqlValue::SingleQuotedString(s) | SqlValue::EscapedStringLiteral(s) => s.clone(),
                    _ => return Err(self.ns("this kind of literal is", e)),
                };
                Ok(PKind::Cast(Box::new(lit_expr(Lit::Str(s), text.to_string())), t))
            }
            _ => Err(self.ns("this construct is", e)),
        }
    }

    #[inline(never)]
    fn special_function(&mut self, e: &Expr) -> CdcResult<PKind> {
        Ok(match e {
            Expr::Ceil { expr, field } | Expr::Floor { expr, field } => {
                let f = if matches!(e, Expr::Ceil { .. }) { Func::Ceil } else { Func::Floor };
                match field {
                    CeilFloorKind::DateTimeField(DateTimeField::NoDateTime) => PKind::Func(f, vec![self.expr(expr)?]),
                    _ => return Err(self.ns("this form of CEIL/FLOOR is", e)),
                }
            }
            Expr::Position { expr, r#in } => PKind::Func(Func::Strpos, vec![self.expr(r#in)?, self.expr(expr)?]),
            Expr::Substring { expr, substring_from, substring_for, .. } => {
                let mut args = vec![self.expr(expr)?];
                args.push(match substring_from {
                    Some(f) => self.expr(f)?,
                    None => lit_expr(Lit::Int(1), "1".into()),
                });
                if let Some(f) = substring_for {
                    args.push(self.expr(f)?);
                }
                PKind::Func(Func::Substr, args)
            }
            Expr::Trim { trim_where, trim_what, expr, trim_characters } => {
                let f = match trim_where {
                    None | Some(TrimWhereField::Both) => Func::Btrim,
                    Some(TrimWhereField::Leading) => Func::Ltrim,
                    Some(TrimWhereField::Trailing) => Func::Rtrim,
                };
                let mut args = vec![self.expr(expr)?];
                if let Some(w) = trim_what {
                    args.push(self.expr(w)?);
                }
                match trim_characters.as_deref() {
                    None => {}
                    Some([c]) if args.len() == 1 => args.push(self.expr(c)?),
                    Some(_) => return Err(self.ns("this form of TRIM is", e)),
                }
                PKind::Func(f, args)
            }
            _ => return Err(self.ns("this construct is", e)),
        })
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn like(
        &mut self,
        e: &Expr,
        negated: bool,
        any: bool,
        expr: &Expr,
        pattern: &Expr,
        escape: Option<&Expr>,
        ci: bool,
    ) -> CdcResult<PKind> {
        if any {
            return Err(self.ns("LIKE ANY is", e));
        }
        let escape = match escape.map(strip_nested) {
            None => Some('\\'),
            Some(Expr::Value(v)) => match &v.value {
                SqlValue::SingleQuotedString(s) | SqlValue::EscapedStringLiteral(s) => {
                    let mut chars = s.chars();
                    match (chars.next(), chars.next()) {
                        (None, _) => None,
                        (Some(c), None) => Some(c),
                        _ => {
                            return Err(err(
                                ErrorKind::InvalidEscapeSequence,
                                format!("invalid escape string: {}", self.frag(e)),
                            )
                            .hint("Escape string must be empty or one character."))
                        }
                    }
                }
                _ => return Err(self.ns("an ESCAPE that is not a string literal is", e)),
            },
            Some(_) => return Err(self.ns("an ESCAPE that is not a string literal is", e)),
        };
        Ok(PKind::Like { arg: self.boxed(expr)?, pat: self.boxed(pattern)?, escape, ci, negated })
    }

    #[inline(never)]
    fn function(&mut self, e: &Expr, f: &Function) -> CdcResult<PKind> {
        let (schema, name) = object_name(&f.name);
        let text = self.frag(e);
        if f.over.is_some() || WINDOW_FUNCTIONS.contains(&name.as_str()) {
            return Err(err(
                ErrorKind::WindowingError,
                format!("window functions are not allowed in {}: {text}", self.ctx),
            )
            .hint("An expression sees one row at a time."));
        }
        if AGGREGATES.contains(&name.as_str()) {
            return Err(err(
                ErrorKind::GroupingError,
                format!("aggregate functions are not allowed in {}: {text}", self.ctx),
            )
            .hint("An expression sees one row at a time."));
        }
        if NOT_IMMUTABLE.contains(&name.as_str()) || NOT_IMMUTABLE_PREFIXES.iter().any(|p| name.starts_with(p)) {
            return Err(err(
                ErrorKind::InvalidObjectDefinition,
                format!("functions in {} must be immutable: {text}", self.ctx),
            )
            .detail(format!("{name}() can return a different result each time it is called."))
            .hint(
                "The expression is evaluated when the change is decoded, possibly much later or again after a restart.",
            ));
        }
        let entry = match schema.as_deref() {
            None | Some("pg_catalog") => FUNCTIONS.iter().find(|x| x.0 == name),
            Some(_) => None,
        };
        let Some(&(_, func, min, max)) = entry else {
            let shown = match &schema {
                Some(s) => format!("{s}.{name}"),
                None => name.clone(),
            };
            return Err(err(ErrorKind::UndefinedFunction, format!("function {shown}() does not exist: {text}"))
                .hint(format!("Functions available in expressions: {}.", function_names())));
        };
        if f.filter.is_some() || !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(err(
                ErrorKind::WrongObjectType,
                format!("{name} is not an aggregate function, FILTER / WITHIN GROUP do not apply: {text}"),
            ));
        }
        if !matches!(f.parameters, FunctionArguments::None) {
            return Err(self.ns("this form of function call is", e));
        }
        let list = match &f.args {
            FunctionArguments::List(l) => l,
            FunctionArguments::Subquery(_) => return Err(self.sq(e)),
            FunctionArguments::None => {
                return Err(err(ErrorKind::SyntaxError, format!("function {name} needs parentheses: {text}")))
            }
        };
        if list.duplicate_treatment == Some(DuplicateTreatment::Distinct) || !list.clauses.is_empty() {
            return Err(err(
                ErrorKind::WrongObjectType,
                format!("{name} is not an aggregate function, DISTINCT / ORDER BY do not apply: {text}"),
            ));
        }
        let mut args = Vec::with_capacity(list.args.len());
        for a in &list.args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => args.push(self.expr(x)?),
                FunctionArg::Unnamed(_) => {
                    return Err(err(ErrorKind::SyntaxError, format!("* is not a function argument: {text}")))
                }
                _ => return Err(self.ns("named function arguments are", e)),
            }
        }
        if args.len() < min || args.len() > max {
            return Err(err(
                ErrorKind::UndefinedFunction,
                format!("function {name} does not take {} argument(s): {text}", args.len()),
            ));
        }
        Ok(PKind::Func(func, args))
    }
}

fn subquery(ctx: &str, text: &str) -> CdcError {
    err(ErrorKind::FeatureNotSupported, format!("subqueries are not allowed in {ctx}: {text}"))
        .hint("An expression sees only the row being changed; it cannot read tables.")
}
