//! [`PExpr`] + the table's columns -> [`Node`]: resolves columns to indices, types every node with
//! PostgreSQL's rules (unknown literals take the other side's type, numeric widening, no implicit
//! text conversions), inserts the implicit casts, folds constant subexpressions (raising their
//! errors now, as PostgreSQL's planner does) and specialises `column <op> constant`.

use std::borrow::Cow;

use super::eval::{big_message, Key, KeySet, LikeP, Node};
use super::like::LikePat;
use super::num::{DecKey, Numeric};
use super::parse::{ArOp, CmpOp, Func, Lit, PExpr, PKind};
use super::val::{can_cast, parse_input, Target, Ty, Val};
use super::ColumnInfo;
use crate::error::{did_you_mean, CdcError, CdcResult, ErrorKind};

pub(crate) struct Binder<'c> {
    pub cols: &'c [ColumnInfo],
    pub used: Vec<usize>,
    pub ctx: &'static str,
}

type Bn = (Node, Ty);

fn err(kind: ErrorKind, msg: impl Into<String>) -> CdcError {
    CdcError::new(kind, msg)
}

const CAST_HINT: &str =
    "No operator matches the given name and argument types. You might need to add explicit type casts.";
const FUNC_HINT: &str =
    "No function matches the given name and argument types. You might need to add explicit type casts.";

fn func_name(f: Func) -> &'static str {
    match f {
        Func::Abs => "abs",
        Func::Round => "round",
        Func::Floor => "floor",
        Func::Ceil => "ceil",
        Func::Trunc => "trunc",
        Func::Sign => "sign",
        Func::Mod => "mod",
        Func::Lower => "lower",
        Func::Upper => "upper",
        Func::Length => "length",
        Func::OctetLength => "octet_length",
        Func::Btrim => "btrim",
        Func::Ltrim => "ltrim",
        Func::Rtrim => "rtrim",
        Func::Substr => "substr",
        Func::Coalesce => "coalesce",
        Func::Nullif => "nullif",
        Func::Greatest => "greatest",
        Func::Least => "least",
        Func::StartsWith => "starts_with",
        Func::Strpos => "strpos",
        Func::Replace => "replace",
        Func::Left => "left",
        Func::Right => "right",
    }
}

impl Node {
    fn is_const(&self) -> bool {
        matches!(self, Node::Const(_))
    }

    fn is_null_const(&self) -> bool {
        matches!(self, Node::Const(Val::Null))
    }

    /// Direct children, for folding.
    fn children(&self) -> Vec<&Node> {
        match self {
            Node::Const(_)
            | Node::BigNum(_)
            | Node::Col { .. }
            | Node::ColCmp { .. }
            | Node::ColIn { .. }
            | Node::ColIsNull { .. } => vec![],
            Node::Not(a) | Node::Neg(a) | Node::IsNull { arg: a, .. } | Node::IsBool { arg: a, .. } => vec![a],
            Node::Cast { arg, .. } => vec![arg],
            Node::And(v) | Node::Or(v) | Node::Func { args: v, .. } => v.iter().collect(),
            Node::Cmp { l, r, .. } | Node::Distinct { l, r, .. } | Node::Arith { l, r, .. } | Node::Concat(l, r) => {
                vec![l, r]
            }
            Node::In { arg, list, .. } => std::iter::once(&**arg).chain(list.iter()).collect(),
            Node::Like { arg, pat, .. } => match pat {
                LikeP::Fixed(_) => vec![arg],
                LikeP::Dynamic { pat, .. } => vec![arg, pat],
            },
            Node::Case { whens, else_ } => {
                whens.iter().flat_map(|(a, b)| [a, b]).chain(std::iter::once(&**else_)).collect()
            }
            Node::NullIf { a, a_cmp, b } => vec![a, a_cmp, b],
        }
    }

    /// NULL whenever one of its (direct) operands is NULL.
    fn is_strict(&self) -> bool {
        match self {
            Node::Cmp { .. } | Node::Arith { .. } | Node::Neg(_) | Node::Concat(..) | Node::Like { .. } => true,
            Node::Cast { .. } => true,
            Node::Func { f, .. } => !matches!(f, Func::Coalesce | Func::Greatest | Func::Least),
            _ => false,
        }
    }

    /// The column under implicit widening casts, for the `column <op> constant` fast paths.
    fn as_column(&self) -> Option<(usize, Ty)> {
        match self {
            Node::Col { idx, ty } => Some((*idx, *ty)),
            Node::Cast { arg, implicit: true, .. } => arg.as_column(),
            _ => None,
        }
    }
}

/// The comparison key for a constant compared with a column of type `col` in type `uni`.
fn make_key(col: Ty, uni: Ty, v: &Val<'_>) -> Option<Key> {
    Some(match (col, uni, v) {
        (Ty::Text, Ty::Text, Val::Text(t)) => Key::Bytes(t.as_ref().into()),
        (Ty::Bool, Ty::Bool, Val::Bool(b)) => Key::Bool(*b),
        (Ty::Int, Ty::Int, Val::Int(i)) => Key::Int(*i, DecKey::from_numeric(&Numeric::from_i64(*i))),
        (Ty::Int | Ty::Numeric, Ty::Numeric, Val::Num(n)) => Key::Dec(DecKey::from_numeric(n)),
        (Ty::Int | Ty::Numeric | Ty::Float, Ty::Float, Val::Float(f)) => Key::Float(*f),
        (Ty::Date, Ty::Date, Val::Date(d)) => Key::Time { uni, v: i64::from(*d) },
        (Ty::Date | Ty::Timestamp | Ty::TimestampTz, Ty::Timestamp, Val::Ts(t)) => Key::Time { uni, v: *t },
        (Ty::Date | Ty::Timestamp | Ty::TimestampTz, Ty::TimestampTz, Val::TsTz(t)) => Key::Time { uni, v: *t },
        _ => return None,
    })
}

impl Binder<'_> {
    /// Folds a node whose operands are all constant (errors are raised now, with the fragment), and
    /// a strict node with a NULL constant operand to NULL.
    fn fold(&self, node: Node, text: &str) -> CdcResult<Node> {
        // Leaves: constants, and the nodes that read a column themselves.
        if matches!(
            node,
            Node::Const(_)
                | Node::BigNum(_)
                | Node::Col { .. }
                | Node::ColCmp { .. }
                | Node::ColIn { .. }
                | Node::ColIsNull { .. }
        ) {
            return Ok(node);
        }
        let kids = node.children();
        if let Some(Node::BigNum(t)) = kids.iter().find(|k| matches!(k, Node::BigNum(_))) {
            return Err(err(ErrorKind::NumericOutOfRange, big_message(t)));
        }
        if kids.iter().all(|k| k.is_const()) {
            let v = node.eval(&[]).map_err(|e| {
                let mut e = *e;
                if e.detail.is_none() {
                    e.detail = Some(format!("While evaluating the constant expression {text}."));
                }
                e
            })?;
            return Ok(Node::Const(v.into_static()));
        }
        if node.is_strict() && kids.iter().any(|k| k.is_null_const()) {
            return Ok(Node::Const(Val::Null));
        }
        Ok(node)
    }

    /// Converts `n` (of type `from`) to `to` with an implicit cast; unknown literals are read as
    /// `to` now (so `'abc'` compared with an integer fails here, not per row).
    fn coerce(&self, n: Node, from: Ty, to: Ty, text: &str) -> CdcResult<Node> {
        if from == to || to == Ty::Unknown {
            return Ok(n);
        }
        if let Node::BigNum(t) = &n {
            // A literal too large for numeric arithmetic is still a fine float8 or text.
            let target = Target::plain(to);
            if matches!(to, Ty::Float | Ty::Text) {
                return match parse_input(Cow::Owned(t.as_bytes().to_vec()), &target) {
                    Ok(v) => Ok(Node::Const(v.into_static())),
                    Err(e) => Err(*e),
                };
            }
        }
        self.fold(Node::Cast { arg: Box::new(n), to: Target::plain(to), implicit: true }, text)
    }

    fn other_err(&self, e: &PExpr, t: Ty) -> CdcError {
        err(
            ErrorKind::FeatureNotSupported,
            format!("a {} value can only be tested with IS [NOT] NULL in {}: {}", t.name(), self.ctx, e.text),
        )
        .hint("Cast it to text (::text) to compare its text, or test it with IS NULL.")
    }

    /// Binds an operand that must not be json/bytea/array.
    fn operand(&mut self, e: &PExpr) -> CdcResult<Bn> {
        let (n, t) = self.bind(e)?;
        if let Ty::Other(_) = t {
            return Err(self.other_err(e, t));
        }
        Ok((n, t))
    }

    /// Binds a boolean operand (an unknown literal is read as boolean).
    pub(crate) fn boolean(&mut self, e: &PExpr, what: &str) -> CdcResult<Node> {
        let (n, t) = self.operand(e)?;
        match t {
            Ty::Bool => Ok(n),
            Ty::Unknown => self.coerce(n, t, Ty::Bool, &e.text),
            _ => Err(err(
                ErrorKind::DatatypeMismatch,
                format!("argument of {what} must be type boolean, not type {}: {}", t.name(), e.text),
            )),
        }
    }

    fn column(&mut self, name: &str, e: &PExpr) -> CdcResult<Bn> {
        match self.cols.iter().position(|c| c.name == name) {
            Some(idx) => {
                if !self.used.contains(&idx) {
                    self.used.push(idx);
                }
                let ty = Ty::from_kind(self.cols[idx].kind);
                Ok((Node::Col { idx, ty }, ty))
            }
            None => {
                let mut e = err(ErrorKind::UndefinedColumn, format!("column \"{name}\" does not exist: {}", e.text));
                if let Some(c) = self.cols.iter().find(|c| c.name.eq_ignore_ascii_case(name)) {
                    e = e.hint(format!(
                        "Perhaps you meant to reference the column \"{}\": names that are not all lower case must \
                         be double-quoted.",
                        c.name
                    ));
                } else if let Some(c) = did_you_mean(name, self.cols.iter().map(|c| c.name.as_str())) {
                    e = e.hint(format!("Perhaps you meant to reference the column \"{c}\"."));
                }
                Err(e)
            }
        }
    }

    /// Binds both sides of a comparison and converts them to their common type.
    fn compare_pair(&mut self, op: &str, a: &PExpr, b: &PExpr, text: &str) -> CdcResult<(Node, Node, Ty)> {
        let (na, ta) = self.operand(a)?;
        let (nb, tb) = self.operand(b)?;
        self.unify_pair(op, (na, ta), (nb, tb), text)
    }

    fn unify_pair(&self, op: &str, (na, ta): Bn, (nb, tb): Bn, text: &str) -> CdcResult<(Node, Node, Ty)> {
        let Some(uni) = Ty::unify(ta, tb) else {
            return Err(err(
                ErrorKind::UndefinedFunction,
                format!("operator does not exist: {} {op} {}: {text}", ta.name(), tb.name()),
            )
            .hint(CAST_HINT));
        };
        Ok((self.coerce(na, ta, uni, text)?, self.coerce(nb, tb, uni, text)?, uni))
    }

    /// A comparison node, specialised when one side is a column and the other a constant.
    fn cmp_node(&self, op: CmpOp, l: Node, r: Node, uni: Ty, text: &str) -> CdcResult<Node> {
        let big = match (&l, &r) {
            (c, Node::BigNum(t)) => c.as_column().map(|c| (c, op, t)),
            (Node::BigNum(t), c) => c.as_column().map(|c| (c, op.mirror(), t)),
            _ => None,
        };
        if let Some(((idx, col), op, t)) = big {
            if uni == Ty::Numeric {
                if let Some(k) = DecKey::from_literal(t) {
                    return Ok(Node::ColCmp { idx, col, op, key: Key::Dec(k) });
                }
            }
        }
        let node = self.fold(Node::Cmp { op, l: Box::new(l), r: Box::new(r) }, text)?;
        let Node::Cmp { op, l, r } = node else { return Ok(node) };
        let special = match (&*l, &*r) {
            (c, Node::Const(v)) => c.as_column().zip(Some((op, v))),
            (Node::Const(v), c) => c.as_column().zip(Some((op.mirror(), v))),
            _ => None,
        };
        if let Some(((idx, col), (op, v))) = special {
            if let Some(key) = make_key(col, uni, v) {
                return Ok(Node::ColCmp { idx, col, op, key });
            }
        }
        Ok(Node::Cmp { op, l, r })
    }

    /// A common type for several expressions (CASE, COALESCE, GREATEST, ...).
    fn common_type(&self, what: &str, items: &[Ty], text: &str) -> CdcResult<Ty> {
        let mut t = Ty::Unknown;
        for &x in items {
            t = match (t, x) {
                (Ty::Unknown, x) => x,
                (t, Ty::Unknown) => t,
                (t, x) => match Ty::unify(t, x) {
                    Some(u) => u,
                    None => {
                        return Err(err(
                            ErrorKind::DatatypeMismatch,
                            format!("{what} types {} and {} cannot be matched: {text}", t.name(), x.name()),
                        ))
                    }
                },
            };
        }
        Ok(if t == Ty::Unknown { Ty::Text } else { t })
    }

    pub(crate) fn bind(&mut self, e: &PExpr) -> CdcResult<Bn> {
        let text = e.text.as_str();
        let (node, ty) = match &e.kind {
            PKind::Col(name) => return self.column(name, e),
            PKind::Lit(l) => {
                return Ok(match l {
                    Lit::Int(i) => (Node::Const(Val::Int(*i)), Ty::Int),
                    Lit::Num(n) => (Node::Const(Val::Num(*n)), Ty::Numeric),
                    Lit::BigNum(t) => (Node::BigNum(t.as_str().into()), Ty::Numeric),
                    Lit::Str(s) => (Node::Const(Val::Text(Cow::Owned(s.clone().into_bytes()))), Ty::Unknown),
                    Lit::Bool(b) => (Node::Const(Val::Bool(*b)), Ty::Bool),
                    Lit::Null => (Node::Const(Val::Null), Ty::Unknown),
                })
            }
            PKind::Not(a) => (Node::Not(Box::new(self.boolean(a, "NOT")?)), Ty::Bool),
            PKind::And(v) | PKind::Or(v) => {
                let and = matches!(e.kind, PKind::And(_));
                let mut nodes = Vec::with_capacity(v.len());
                for x in v {
                    nodes.push(self.boolean(x, if and { "AND" } else { "OR" })?);
                }
                (if and { Node::And(nodes) } else { Node::Or(nodes) }, Ty::Bool)
            }
            PKind::Neg(a) | PKind::Plus(a) => {
                let (n, t) = self.operand(a)?;
                let (n, t) =
                    if t == Ty::Unknown { (self.coerce(n, t, Ty::Numeric, text)?, Ty::Numeric) } else { (n, t) };
                if !t.is_number() {
                    let op = if matches!(e.kind, PKind::Neg(_)) { "-" } else { "+" };
                    return Err(err(
                        ErrorKind::UndefinedFunction,
                        format!("operator does not exist: {op} {}: {text}", t.name()),
                    )
                    .hint(CAST_HINT));
                }
                if matches!(e.kind, PKind::Plus(_)) {
                    return Ok((n, t));
                }
                (Node::Neg(Box::new(n)), t)
            }
            PKind::Cmp(op, a, b) => {
                let (l, r, uni) = self.compare_pair(op.symbol(), a, b, text)?;
                return Ok((self.cmp_node(*op, l, r, uni, text)?, Ty::Bool));
            }
            PKind::Distinct(a, b, negated) => {
                let (l, r, _) = self.compare_pair("=", a, b, text)?;
                (Node::Distinct { l: Box::new(l), r: Box::new(r), negated: *negated }, Ty::Bool)
            }
            PKind::Arith(op, a, b) => {
                let (na, ta) = self.operand(a)?;
                let (nb, tb) = self.operand(b)?;
                let no_op = || {
                    err(
                        ErrorKind::UndefinedFunction,
                        format!("operator does not exist: {} {} {}: {text}", ta.name(), op.symbol(), tb.name()),
                    )
                    .hint(CAST_HINT)
                };
                let uni = match (ta, tb) {
                    (Ty::Unknown, Ty::Unknown) => return Err(no_op()),
                    (x, y) if (x.is_number() || x == Ty::Unknown) && (y.is_number() || y == Ty::Unknown) => {
                        Ty::unify(x, y).ok_or_else(no_op)?
                    }
                    _ => return Err(no_op()),
                };
                if uni == Ty::Float && *op == ArOp::Mod {
                    return Err(no_op());
                }
                let l = self.coerce(na, ta, uni, text)?;
                let r = self.coerce(nb, tb, uni, text)?;
                (Node::Arith { op: *op, l: Box::new(l), r: Box::new(r) }, uni)
            }
            PKind::Concat(a, b) => {
                let (na, ta) = self.operand(a)?;
                let (nb, tb) = self.operand(b)?;
                let texty = |t: Ty| matches!(t, Ty::Text | Ty::Unknown);
                if !texty(ta) && !texty(tb) {
                    return Err(err(
                        ErrorKind::UndefinedFunction,
                        format!("operator does not exist: {} || {}: {text}", ta.name(), tb.name()),
                    )
                    .hint(CAST_HINT));
                }
                let l = self.to_text(na, ta, text)?;
                let r = self.to_text(nb, tb, text)?;
                (Node::Concat(Box::new(l), Box::new(r)), Ty::Text)
            }
            PKind::IsNull(a, negated) => {
                let (n, _) = self.bind(a)?;
                let node = match n {
                    Node::Col { idx, .. } => Node::ColIsNull { idx, negated: *negated },
                    n => Node::IsNull { arg: Box::new(n), negated: *negated },
                };
                (node, Ty::Bool)
            }
            PKind::IsBool(a, value, negated) => {
                let n = self.boolean(a, "IS TRUE / IS FALSE")?;
                (Node::IsBool { arg: Box::new(n), value: *value, negated: *negated }, Ty::Bool)
            }
            PKind::In(a, list, negated) => return self.in_list(a, list, *negated, text),
            PKind::Between(a, lo, hi, negated) => {
                let (na, ta) = self.operand(a)?;
                let (nl, tl) = self.operand(lo)?;
                let (nh, th) = self.operand(hi)?;
                let uni = [tl, th].iter().try_fold(ta, |acc, &t| Ty::unify(acc, t)).ok_or_else(|| {
                    err(
                        ErrorKind::UndefinedFunction,
                        format!("BETWEEN cannot compare {} with {} and {}: {text}", ta.name(), tl.name(), th.name()),
                    )
                    .hint(CAST_HINT)
                })?;
                let a1 = self.coerce(na, ta, uni, text)?;
                let lo = self.coerce(nl, tl, uni, text)?;
                let hi = self.coerce(nh, th, uni, text)?;
                let ge = self.cmp_node(CmpOp::Ge, a1.clone(), lo, uni, text)?;
                let le = self.cmp_node(CmpOp::Le, a1, hi, uni, text)?;
                let both = self.fold(Node::And(vec![ge, le]), text)?;
                let node = if *negated { self.fold(Node::Not(Box::new(both)), text)? } else { both };
                return Ok((node, Ty::Bool));
            }
            PKind::Like { arg, pat, escape, ci, negated } => {
                let (na, ta) = self.operand(arg)?;
                let (np, tp) = self.operand(pat)?;
                let texty = |t: Ty| matches!(t, Ty::Text | Ty::Unknown);
                if !texty(ta) || !texty(tp) {
                    let op = match (ci, negated) {
                        (false, false) => "~~",
                        (false, true) => "!~~",
                        (true, false) => "~~*",
                        (true, true) => "!~~*",
                    };
                    return Err(err(
                        ErrorKind::UndefinedFunction,
                        format!("operator does not exist: {} {op} {}: {text}", ta.name(), tp.name()),
                    )
                    .hint(CAST_HINT));
                }
                let na = self.coerce(na, ta, Ty::Text, text)?;
                let np = self.coerce(np, tp, Ty::Text, text)?;
                let pat = match &np {
                    Node::Const(Val::Text(p)) => LikeP::Fixed(LikePat::compile(p, *escape, *ci).map_err(|_| {
                        err(
                            ErrorKind::InvalidEscapeSequence,
                            format!("LIKE pattern must not end with escape character: {text}"),
                        )
                    })?),
                    _ => LikeP::Dynamic { pat: Box::new(np), escape: *escape, ci: *ci },
                };
                (Node::Like { arg: Box::new(na), pat, negated: *negated }, Ty::Bool)
            }
            PKind::Case { operand, whens, else_ } => {
                return self.case(operand.as_deref(), whens, else_.as_deref(), text)
            }
            PKind::Cast(a, target) => {
                let (n, t) = self.bind(a)?;
                if let Ty::Other(_) = t {
                    if target.ty != Ty::Text {
                        return Err(err(
                            ErrorKind::CannotCoerce,
                            format!("cannot cast type {} to {}: {text}", t.name(), target.name()),
                        )
                        .hint("json, bytea and array values can only be cast to text here."));
                    }
                } else if !can_cast(t, target.ty) {
                    return Err(err(
                        ErrorKind::CannotCoerce,
                        format!("cannot cast type {} to {}: {text}", t.name(), target.name()),
                    ));
                }
                let to = *target;
                if matches!(n, Node::BigNum(_)) && to.ty == Ty::Float {
                    return Ok((self.coerce(n, t, Ty::Float, text)?, Ty::Float));
                }
                (
                    Node::Cast { arg: Box::new(n), to, implicit: false },
                    if to.ty == Ty::Unknown { Ty::Text } else { to.ty },
                )
            }
            PKind::Func(f, args) => return self.function(*f, args, e),
        };
        Ok((self.fold(node, text)?, ty))
    }

    /// A value as text (`||`): unknown literals are text; other types print their text output.
    fn to_text(&self, n: Node, t: Ty, text: &str) -> CdcResult<Node> {
        match t {
            Ty::Text => Ok(n),
            Ty::Unknown => self.coerce(n, t, Ty::Text, text),
            _ => self.fold(Node::Cast { arg: Box::new(n), to: Target::plain(Ty::Text), implicit: false }, text),
        }
    }

    fn in_list(&mut self, a: &PExpr, list: &[PExpr], negated: bool, text: &str) -> CdcResult<Bn> {
        let (na, ta) = self.operand(a)?;
        let mut items = Vec::with_capacity(list.len());
        let mut uni = ta;
        for x in list {
            let (n, t) = self.operand(x)?;
            uni = Ty::unify(uni, t).ok_or_else(|| {
                err(
                    ErrorKind::UndefinedFunction,
                    format!("operator does not exist: {} = {}: {text}", uni.name(), t.name()),
                )
                .hint(CAST_HINT)
            })?;
            items.push((n, t));
        }
        let arg = self.coerce(na, ta, uni, text)?;
        let mut nodes = Vec::with_capacity(items.len());
        for (n, t) in items {
            nodes.push(self.coerce(n, t, uni, text)?);
        }
        // column IN (constants): keys.
        if let Some((idx, col)) = arg.as_column() {
            if nodes.iter().all(|n| matches!(n, Node::Const(_) | Node::BigNum(_))) {
                let mut keys = Vec::new();
                let mut has_null = false;
                let mut ok = true;
                for n in &nodes {
                    match n {
                        Node::Const(Val::Null) => has_null = true,
                        Node::BigNum(t) if uni == Ty::Numeric => match DecKey::from_literal(t) {
                            Some(k) => keys.push(Key::Dec(k)),
                            None => ok = false,
                        },
                        Node::Const(v) => match make_key(col, uni, v) {
                            Some(k) => keys.push(k),
                            None => ok = false,
                        },
                        _ => ok = false,
                    }
                }
                if ok {
                    let keys = if keys.iter().all(|k| matches!(k, Key::Bytes(_))) {
                        let mut b: Vec<Box<[u8]>> = keys
                            .into_iter()
                            .filter_map(|k| if let Key::Bytes(b) = k { Some(b) } else { None })
                            .collect();
                        b.sort();
                        b.dedup();
                        KeySet::Bytes(b)
                    } else if keys.iter().all(|k| matches!(k, Key::Int(..))) {
                        let mut v: Vec<i64> = keys
                            .into_iter()
                            .filter_map(|k| if let Key::Int(i, _) = k { Some(i) } else { None })
                            .collect();
                        v.sort_unstable();
                        v.dedup();
                        KeySet::Ints(v)
                    } else {
                        KeySet::Keys(keys)
                    };
                    return Ok((Node::ColIn { idx, col, keys, has_null, negated }, Ty::Bool));
                }
            }
        }
        let node = Node::In { arg: Box::new(arg), list: nodes, negated };
        Ok((self.fold(node, text)?, Ty::Bool))
    }

    fn case(
        &mut self,
        operand: Option<&PExpr>,
        whens: &[(PExpr, PExpr)],
        else_: Option<&PExpr>,
        text: &str,
    ) -> CdcResult<Bn> {
        let op = match operand {
            Some(o) => Some(self.operand(o)?),
            None => None,
        };
        let mut conds = Vec::with_capacity(whens.len());
        let mut results = Vec::with_capacity(whens.len() + 1);
        for (w, r) in whens {
            let cond = match &op {
                // CASE x WHEN v: x = v.
                Some((on, ot)) => {
                    let (nv, tv) = self.operand(w)?;
                    let (l, r, uni) = self.unify_pair("=", (on.clone(), *ot), (nv, tv), &w.text)?;
                    self.cmp_node(CmpOp::Eq, l, r, uni, &w.text)?
                }
                None => self.boolean(w, "CASE/WHEN")?,
            };
            conds.push(cond);
            results.push(self.operand(r)?);
        }
        let else_node = match else_ {
            Some(x) => self.operand(x)?,
            None => (Node::Const(Val::Null), Ty::Unknown),
        };
        results.push(else_node);
        let types: Vec<Ty> = results.iter().map(|r| r.1).collect();
        let t = self.common_type("CASE", &types, text)?;
        let mut converted = Vec::with_capacity(results.len());
        for (n, rt) in results {
            converted.push(self.coerce(n, rt, t, text)?);
        }
        let else_ = converted.pop().unwrap_or(Node::Const(Val::Null));
        let node = Node::Case { whens: conds.into_iter().zip(converted).collect(), else_: Box::new(else_) };
        Ok((self.fold(node, text)?, t))
    }

    fn no_function(&self, f: Func, types: &[Ty], text: &str) -> CdcError {
        let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
        err(
            ErrorKind::UndefinedFunction,
            format!("function {}({}) does not exist: {text}", func_name(f), names.join(", ")),
        )
        .hint(FUNC_HINT)
    }

    fn function(&mut self, f: Func, args: &[PExpr], e: &PExpr) -> CdcResult<Bn> {
        let text = e.text.as_str();
        let mut bound = Vec::with_capacity(args.len());
        for a in args {
            bound.push(self.operand(a)?);
        }
        let types: Vec<Ty> = bound.iter().map(|b| b.1).collect();
        let no = || self.no_function(f, &types, text);
        // The result type and the type each argument is converted to.
        let (ty, arg_types): (Ty, Vec<Ty>) = match f {
            Func::Coalesce | Func::Greatest | Func::Least => {
                let what = match f {
                    Func::Coalesce => "COALESCE",
                    Func::Greatest => "GREATEST",
                    _ => "LEAST",
                };
                let t = self.common_type(what, &types, text)?;
                (t, vec![t; types.len()])
            }
            Func::Nullif => {
                let mut it = bound.into_iter();
                let (na, ta) = it.next().ok_or_else(no)?;
                let (nb, tb) = it.next().ok_or_else(no)?;
                let (a_cmp, b, uni) = self.unify_pair("=", (na.clone(), ta), (nb, tb), text)?;
                let (a, ty) = if ta == Ty::Unknown { (a_cmp.clone(), uni) } else { (na, ta) };
                let node = Node::NullIf { a: Box::new(a), a_cmp: Box::new(a_cmp), b: Box::new(b) };
                return Ok((self.fold(node, text)?, ty));
            }
            Func::Mod => {
                let mut it = bound.into_iter();
                let a = it.next().ok_or_else(no)?;
                let b = it.next().ok_or_else(no)?;
                let uni = match (a.1, b.1) {
                    (x, y) if (x.is_number() || x == Ty::Unknown) && (y.is_number() || y == Ty::Unknown) => {
                        match Ty::unify(x, y) {
                            Some(Ty::Int) => Ty::Int,
                            Some(Ty::Numeric | Ty::Text) => Ty::Numeric,
                            _ => return Err(no()),
                        }
                    }
                    _ => return Err(no()),
                };
                let l = self.coerce(a.0, a.1, uni, text)?;
                let r = self.coerce(b.0, b.1, uni, text)?;
                let node = Node::Arith { op: ArOp::Mod, l: Box::new(l), r: Box::new(r) };
                return Ok((self.fold(node, text)?, uni));
            }
            Func::Abs => match types[0] {
                t @ (Ty::Int | Ty::Numeric | Ty::Float) => (t, vec![t]),
                Ty::Unknown => (Ty::Numeric, vec![Ty::Numeric]),
                _ => return Err(no()),
            },
            Func::Round | Func::Trunc if types.len() == 2 => {
                if !matches!(types[0], Ty::Int | Ty::Numeric | Ty::Unknown)
                    || !matches!(types[1], Ty::Int | Ty::Unknown)
                {
                    return Err(no().hint(format!(
                        "{}(x, n) takes a numeric x and an integer n; cast x to numeric (x::numeric).",
                        func_name(f)
                    )));
                }
                (Ty::Numeric, vec![Ty::Numeric, Ty::Int])
            }
            // PostgreSQL resolves an integer argument to the float8 version (float8 is the
            // preferred numeric type).
            Func::Round | Func::Trunc | Func::Floor | Func::Ceil | Func::Sign => match types[0] {
                Ty::Int => (Ty::Float, vec![Ty::Float]),
                t @ (Ty::Numeric | Ty::Float) => (t, vec![t]),
                Ty::Unknown => (Ty::Numeric, vec![Ty::Numeric]),
                _ => return Err(no()),
            },
            Func::Lower | Func::Upper | Func::Btrim | Func::Ltrim | Func::Rtrim | Func::Replace => {
                if !types.iter().all(|t| matches!(t, Ty::Text | Ty::Unknown)) {
                    return Err(no());
                }
                (Ty::Text, vec![Ty::Text; types.len()])
            }
            Func::Length | Func::OctetLength => {
                if !matches!(types[0], Ty::Text | Ty::Unknown) {
                    return Err(no());
                }
                (Ty::Int, vec![Ty::Text])
            }
            Func::StartsWith | Func::Strpos => {
                if !types.iter().all(|t| matches!(t, Ty::Text | Ty::Unknown)) {
                    return Err(no());
                }
                (if f == Func::StartsWith { Ty::Bool } else { Ty::Int }, vec![Ty::Text, Ty::Text])
            }
            Func::Substr => {
                if !matches!(types[0], Ty::Text | Ty::Unknown) {
                    return Err(no());
                }
                // substring(x FROM 'pattern') is the regular-expression form in PostgreSQL.
                if matches!(types[1], Ty::Text | Ty::Unknown) {
                    return Err(no().hint(
                        "substring(x FROM pattern) with a text pattern (regular expressions) is not supported.",
                    ));
                }
                if !types[1..].iter().all(|t| matches!(t, Ty::Int | Ty::Unknown)) {
                    return Err(no());
                }
                let mut v = vec![Ty::Text];
                v.extend(std::iter::repeat_n(Ty::Int, types.len() - 1));
                (Ty::Text, v)
            }
            Func::Left | Func::Right => {
                if !matches!(types[0], Ty::Text | Ty::Unknown) || !matches!(types[1], Ty::Int | Ty::Unknown) {
                    return Err(no());
                }
                (Ty::Text, vec![Ty::Text, Ty::Int])
            }
        };
        let mut nodes = Vec::with_capacity(bound.len());
        for ((n, t), want) in bound.into_iter().zip(arg_types) {
            nodes.push(self.coerce(n, t, want, text)?);
        }
        let node = Node::Func { f, args: nodes };
        Ok((self.fold(node, text)?, ty))
    }
}
