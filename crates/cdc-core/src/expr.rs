//! SQL expressions over one row: row filters (`status != 'draft'`,
//! `reading_value > threshold OR alert_level = 'critical'`) and computed columns
//! (`ABS(reading_value - baseline) / baseline * 100`).
//!
//! ```text
//!  text ──parse──▶ Parsed ──bind(columns)──▶ Bound ──filter / matched_branch / eval(row)──▶ bool / &str / Value
//!        sqlparser          names -> indices,         no allocation for comparisons,
//!        + checks           types, constant folding,  row = pgoutput text values
//!                           column-vs-constant keys
//! ```
//!
//! [`parse()`] reads exactly one scalar expression with sqlparser's PostgreSQL dialect. Nothing is ever
//! executed by PostgreSQL: `a = 1; DROP TABLE t` or `1=1) OR (1=1` are syntax errors (42601), and
//! comments are refused so the stored text can be embedded safely. Refused at parse time: subqueries
//! (0A000), aggregates (42803), window functions (42P20), other tables' columns (42P01), volatile or
//! stable functions such as `now()`, `random()`, `nextval()`, `pg_*` (42P17), functions outside the
//! list below (42883), parameters `$1` (42P02), and constructs the engine does not evaluate (0A000).
//!
//! [`Parsed::bind`] resolves columns (unquoted names fold to lower case, `"Quoted"` keep their case;
//! 42703 with a did-you-mean hint) and types the tree with PostgreSQL's rules:
//! - a quoted literal is `unknown` and takes the type of the other operand (`amount > '5'` reads
//!   `'5'` as a number, `created_at > '2024-03-15'` as a timestamp); an invalid one is an error at
//!   bind time (22P02, 22007, 22008);
//! - numbers widen integer -> numeric -> float8; dates widen date -> timestamp -> timestamptz;
//! - there is no implicit conversion between text and numbers, booleans or dates: `text_col > 5`
//!   is 42883 "operator does not exist: text > integer", as in PostgreSQL (cast explicitly);
//! - `||` turns a non-text operand into its text output (`'n=' || 5`);
//! - a filter must be boolean (42804); json, jsonb, bytea and array columns can only be tested with
//!   `IS [NOT] NULL` or cast to text (`payload::text LIKE '%x%'`), anything else is 0A000.
//!
//! Constant subexpressions are folded at bind time; their errors (`1/0`) are raised then, as
//! PostgreSQL's planner does.
//!
//! Supported: `= <> != < <= > >=`, `AND OR NOT`, `IS [NOT] NULL / TRUE / FALSE / UNKNOWN`,
//! `IS [NOT] DISTINCT FROM`, `[NOT] IN (list)`, `[NOT] BETWEEN`, `[NOT] LIKE / ILIKE [ESCAPE]`,
//! `+ - * / %`, unary `-`, `||`, `CASE`, `CAST(x AS t)` / `x::t` (smallint, integer, bigint,
//! numeric[(p,s)], real/double precision, text, varchar[(n)], boolean, date, timestamp,
//! timestamptz), `DATE '...'`-style typed literals, and the immutable functions abs, round, trunc,
//! floor, ceil/ceiling, sign, mod, lower, upper, length/char_length, octet_length,
//! trim/btrim/ltrim/rtrim, substring/substr, position/strpos, starts_with, replace, left, right,
//! coalesce, nullif, greatest, least.
//!
//! Evaluation semantics:
//! - Values are pgoutput's text output under the worker's settings (`DateStyle=ISO`,
//!   `TimeZone=UTC`, `extra_float_digits=1`). [`TupleValue::UnchangedToast`] (an unchanged
//!   TOASTed value the WAL did not carry) evaluates as NULL: the caller should avoid filtering on
//!   such columns, or fill them from the old image; [`Bound::column_indices`] lists the columns an
//!   expression reads.
//! - Three-valued logic; a filter passes a row only when the result is TRUE.
//! - Text compares byte-wise (the C collation): equality is exact, but ordering of non-ASCII text
//!   can differ from a database whose default collation is a linguistic one. ILIKE, lower and upper
//!   use Unicode case mapping. Every column of kind [`TypeKind::Text`] compares by its text
//!   output: right for text, varchar, uuid and enum equality, but the ordering of enums, and
//!   equality of types with several spellings (interval `1 day` vs `24:00:00`), follow the text,
//!   not the type.
//! - Integers are computed as int8 with overflow checks (22003, never a panic); integer division
//!   truncates (`7 / 2` is 3) as in PostgreSQL.
//! - numeric is exact decimal arithmetic with at most 28 digits after the point and values below
//!   about 7.9e28 (22003 beyond); `0.1 + 0.2 = 0.3`. Division keeps up to 28 significant digits.
//!   Comparisons of a numeric column with a constant are exact for any number of digits.
//!   `NaN` and `±Infinity` follow PostgreSQL (NaN equals NaN and sorts above everything).
//! - float8 follows PostgreSQL too: NaN = NaN, overflow is an error, text output like
//!   `1.5e+20`. `real` casts compute in float8.
//! - Runtime errors (division by zero 22012, overflow 22003, a bad cast 22P02) do not stop the
//!   pipeline: [`Bound::filter`] treats the row as not matching, [`Bound::eval`] returns NULL, and
//!   both count the error ([`Bound::errors`]). The `try_` variants return the error instead, for
//!   callers that prefer PostgreSQL's behaviour of failing.
//! - Computed numeric values are printed in JSON without needless trailing zeros
//!   (`ABS(95.5 - 80) / 80 * 100` is `19.375`, where PostgreSQL would print `19.3750000000000000`).
//! - A LIKE pattern that is not a constant is compiled for each row.
//!
//! Limits (54001): 16 KiB of text, 64 levels of nesting (a chain of AND or OR counts as one), and
//! sqlparser's own limit of 24 levels of parentheses, function calls and NOT.
//!
//! Performance: a filter of three `column <op> constant` predicates on a 10-column row costs about
//! 25 ns per row (release build, see the `filter_throughput` test).

mod bind;
mod eval;
mod like;
mod num;
mod parse;
mod time;
mod val;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

pub use num::Numeric;
pub use val::Value;

use self::bind::Binder;
use self::eval::Node;
use self::parse::PExpr;
use self::val::{Ty, Val};
use crate::decode::TupleValue;
use crate::error::{CdcError, CdcResult, ErrorKind};
use crate::types::TypeKind;

/// One column of the table an expression is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    /// The column's name, exactly as in the catalog (case-sensitive).
    pub name: String,
    /// How its values are read.
    pub kind: TypeKind,
}

impl ColumnInfo {
    /// A column.
    pub fn new(name: impl Into<String>, kind: TypeKind) -> Self {
        ColumnInfo { name: name.into(), kind }
    }
}

/// What the expression is used for; it only changes the wording of messages and whether the
/// result must be boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Filter,
    Computed,
}

impl Use {
    fn ctx(self) -> &'static str {
        match self {
            Use::Filter => "a filter expression",
            Use::Computed => "a computed column expression",
        }
    }
}

/// A parsed and checked expression, not yet tied to a table.
#[derive(Debug, Clone)]
pub struct Parsed {
    text: String,
    usage: Use,
    root: PExpr,
    /// Top-level OR branches and their source text (one branch when there is no top-level OR).
    branches: Vec<(PExpr, String)>,
    columns: Vec<String>,
}

/// Parses a row filter: one boolean SQL expression such as `status != 'draft'`.
///
/// Errors carry their SQLSTATE (see the module documentation) and quote the offending fragment.
pub fn parse(text: &str) -> CdcResult<Parsed> {
    parse_as(text, Use::Filter)
}

/// Parses a computed column: one SQL expression of any type, such as
/// `ABS(reading_value - baseline) / baseline * 100`.
pub fn parse_computed(text: &str) -> CdcResult<Parsed> {
    parse_as(text, Use::Computed)
}

fn parse_as(text: &str, usage: Use) -> CdcResult<Parsed> {
    let out = parse::parse_text(text, usage.ctx())?;
    let mut columns = Vec::new();
    out.root.collect_columns(&mut columns);
    Ok(Parsed { text: text.trim().to_string(), usage, root: out.root, branches: out.branches, columns })
}

impl Parsed {
    /// The expression as written (surrounding blanks removed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The column names the expression references, folded as PostgreSQL folds them, in order of
    /// first appearance.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The source text of the top-level OR branches (`["reading_value > threshold",
    /// "alert_level = 'critical'"]`), or the whole expression when there is no top-level OR.
    pub fn branches(&self) -> Vec<&str> {
        self.branches.iter().map(|b| b.1.as_str()).collect()
    }

    /// Ties the expression to a table's columns: resolves names, checks and converts types, folds
    /// constants and prepares the fast comparisons. A filter must be boolean (42804).
    pub fn bind(&self, columns: &[ColumnInfo]) -> CdcResult<Bound> {
        let mut b = Binder { cols: columns, used: Vec::new(), ctx: self.usage.ctx() };
        let (root, ty) = match self.usage {
            Use::Filter => (self.filter_root(&mut b, &self.root)?, Ty::Bool),
            Use::Computed => {
                let (n, t) = b.bind(&self.root)?;
                if let Ty::Other(_) = t {
                    return Err(CdcError::new(
                        ErrorKind::FeatureNotSupported,
                        format!(
                            "a {} value can only be tested with IS [NOT] NULL in {}: {}",
                            t.name(),
                            self.usage.ctx(),
                            self.root.text
                        ),
                    )
                    .hint("Cast it to text (::text)."));
                }
                (n, if t == Ty::Unknown { Ty::Text } else { t })
            }
        };
        let branches = if self.usage == Use::Filter && self.branches.len() > 1 {
            let mut v = Vec::with_capacity(self.branches.len());
            for (e, text) in &self.branches {
                v.push((self.filter_root(&mut b, e)?, text.clone()));
            }
            v
        } else {
            Vec::new()
        };
        if let Node::BigNum(t) = &root {
            return Err(CdcError::new(ErrorKind::NumericOutOfRange, eval::big_message(t)));
        }
        let mut column_indices = b.used;
        column_indices.sort_unstable();
        Ok(Bound { text: self.text.clone(), root, ty, branches, column_indices, errors: AtomicU64::new(0) })
    }

    fn filter_root(&self, b: &mut Binder<'_>, e: &PExpr) -> CdcResult<Node> {
        let (n, t) = b.bind(e)?;
        match t {
            Ty::Bool => Ok(n),
            Ty::Unknown => match n {
                Node::Const(Val::Null) => Ok(n),
                _ => b.boolean(e, "a filter"),
            },
            _ => Err(CdcError::new(
                ErrorKind::DatatypeMismatch,
                format!("a filter expression must be type boolean, not type {}: {}", t.name(), e.text),
            )
            .hint("Compare the value with something, e.g. amount > 0.")),
        }
    }
}

/// An expression bound to a table's columns, ready to evaluate rows.
///
/// Evaluation takes the row as pgoutput delivers it (one [`TupleValue`] per column, in the
/// relation's attribute order). It never panics; runtime errors are counted in [`Bound::errors`].
#[derive(Debug)]
pub struct Bound {
    text: String,
    root: Node,
    ty: Ty,
    branches: Vec<(Node, String)>,
    column_indices: Vec<usize>,
    errors: AtomicU64,
}

impl Bound {
    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The type of the result (`Text` for an untyped literal).
    pub fn result_kind(&self) -> TypeKind {
        self.ty.to_kind()
    }

    /// Indices of the columns the expression reads, ascending.
    pub fn column_indices(&self) -> &[usize] {
        &self.column_indices
    }

    /// How many evaluations failed (division by zero, overflow, a bad cast) since binding.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn count<T>(&self, r: CdcResult<T>, default: T) -> T {
        r.unwrap_or_else(|_| {
            self.errors.fetch_add(1, Ordering::Relaxed);
            default
        })
    }

    /// Whether the row passes: the expression is TRUE. NULL, FALSE and a runtime error drop the
    /// row (an error is counted in [`Bound::errors`]).
    #[inline]
    pub fn filter(&self, row: &[TupleValue<'_>]) -> bool {
        let r = self.try_filter(row);
        self.count(r, false)
    }

    /// Like [`Bound::filter`], but a runtime error is returned (PostgreSQL's behaviour).
    #[inline]
    pub fn try_filter(&self, row: &[TupleValue<'_>]) -> CdcResult<bool> {
        match self.root.truth(row) {
            Ok(t) => Ok(t == Some(true)),
            Err(e) => Err(*e),
        }
    }

    /// For a row that passes: the text of the first top-level OR branch that is TRUE
    /// (`reading_value > threshold`), or the whole expression's text when there is no top-level OR.
    /// None exactly when [`Bound::filter`] is false, so it can replace it.
    pub fn matched_branch(&self, row: &[TupleValue<'_>]) -> Option<&str> {
        let r = self.try_matched_branch(row);
        self.count(r, None)
    }

    /// Like [`Bound::matched_branch`], but a runtime error is returned.
    pub fn try_matched_branch(&self, row: &[TupleValue<'_>]) -> CdcResult<Option<&str>> {
        if self.branches.is_empty() {
            return Ok(self.try_filter(row)?.then_some(self.text.as_str()));
        }
        for (n, text) in &self.branches {
            if n.truth(row).map_err(|e| *e)? == Some(true) {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    /// The value of the expression for the row; a runtime error gives NULL (and is counted).
    pub fn eval(&self, row: &[TupleValue<'_>]) -> Value {
        let r = self.try_eval(row);
        self.count(r, Value::Null)
    }

    /// Like [`Bound::eval`], but a runtime error is returned.
    pub fn try_eval(&self, row: &[TupleValue<'_>]) -> CdcResult<Value> {
        match self.root.eval(row) {
            Ok(v) => Ok(v.into_value()),
            Err(e) => Err(*e),
        }
    }
}
