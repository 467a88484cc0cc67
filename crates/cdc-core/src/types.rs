//! How each PostgreSQL type's text output becomes JSON.
//!
//! pgoutput sends every value in its type's text output format (as `psql` would print it under the
//! worker's session settings: `DateStyle=ISO`, `IntervalStyle=iso_8601`, `TimeZone=UTC`,
//! `bytea_output=hex`, `extra_float_digits=1`). [`TypeRegistry`] maps a type OID to a [`TypeKind`] that
//! says how to convert that text without loss. Built-in scalar types are known by OID; arrays,
//! domains, enums, composites and anything from an extension are classified from their `pg_type`
//! row ([`PgTypeRow`]), which the worker reads once per type and the golden tests replay from a file.

use std::collections::HashMap;

/// The conversion a type's values get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    /// `bool`: JSON true/false.
    Bool,
    /// Integers (`int2`, `int4`, `int8`, `oid`, `xid`, ...): JSON number, text copied as is.
    Integer,
    /// `float4`, `float8`: JSON number; `NaN`, `Infinity`, `-Infinity` become strings.
    Float,
    /// `numeric`: JSON number with the exact decimal text (150.00 stays 150.00); `NaN` and the
    /// infinities become strings.
    Numeric,
    /// `json`, `jsonb`: embedded as JSON.
    Json,
    /// `bytea`: base64 string (standard alphabet, padded).
    Bytea,
    /// `timestamptz`: ISO-8601 string in UTC with a `Z` suffix, microseconds kept.
    TimestampTz,
    /// `timestamp` (without time zone): ISO-8601 string without a zone.
    Timestamp,
    /// `date`: ISO-8601 date string; BC dates use astronomical years (`0044-03-15 BC` is `-0043-03-15`).
    Date,
    /// Everything else: a JSON string with the type's text output (text, varchar, uuid, time, interval,
    /// inet, money, bit strings, ranges, geometric types, enums, composites, tsvector, xml, ...).
    Text,
    /// An array; the element type is looked up again for each element.
    Array {
        /// Element type OID.
        element: u32,
        /// Element delimiter in the text format (`,` for every built-in type except `box`).
        delimiter: u8,
    },
}

/// The `pg_type` columns that classify a type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTypeRow {
    /// `oid`.
    pub oid: u32,
    /// `typtype`: b'b' base, b'c' composite, b'd' domain, b'e' enum, b'p' pseudo, b'r' range, b'm' multirange.
    pub typtype: u8,
    /// `typcategory`: b'A' marks arrays.
    pub typcategory: u8,
    /// `typelem`: the element type of an array.
    pub typelem: u32,
    /// `typbasetype`: the base type of a domain.
    pub typbasetype: u32,
    /// `typdelim`: the array element delimiter.
    pub typdelim: u8,
    /// An enum's labels, in their sort order (empty for other types).
    pub enum_labels: Vec<String>,
}

/// Built-in scalar types whose conversion is not plain text.
const BUILTIN_SCALARS: &[(u32, TypeKind)] = &[
    (16, TypeKind::Bool),
    (17, TypeKind::Bytea),
    (20, TypeKind::Integer),   // int8
    (21, TypeKind::Integer),   // int2
    (23, TypeKind::Integer),   // int4
    (26, TypeKind::Integer),   // oid
    (28, TypeKind::Integer),   // xid
    (29, TypeKind::Integer),   // cid
    (5069, TypeKind::Integer), // xid8
    (114, TypeKind::Json),
    (3802, TypeKind::Json), // jsonb
    (700, TypeKind::Float),
    (701, TypeKind::Float),
    (1700, TypeKind::Numeric),
    (1082, TypeKind::Date),
    (1114, TypeKind::Timestamp),
    (1184, TypeKind::TimestampTz),
];

/// Type OIDs below this are built into PostgreSQL (`FirstNormalObjectId`).
pub const FIRST_NORMAL_OID: u32 = 16384;

/// OID -> conversion. Starts with the built-in scalars; learns the rest from `pg_type` rows.
#[derive(Debug, Clone)]
pub struct TypeRegistry {
    kinds: HashMap<u32, TypeKind>,
    /// What else formats other than JSON need of a type that is not a built-in scalar.
    details: HashMap<u32, TypeDetails>,
}

/// What a type is, beyond its conversion (for formats that type their values: Avro, Debezium's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TypeDetails {
    /// `typtype` (b'e' enum, b'd' domain, b'c' composite, b'r' range, ...).
    pub typtype: u8,
    /// A domain's base type, resolved through domains over domains (0 for other types).
    pub base: u32,
    /// An enum's labels in their sort order.
    pub enum_labels: Vec<String>,
}

impl Default for TypeRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl TypeRegistry {
    /// A registry that knows the built-in scalar types.
    pub fn new() -> Self {
        TypeRegistry { kinds: BUILTIN_SCALARS.iter().copied().collect(), details: HashMap::new() }
    }

    /// Whether the type needs its `pg_type` row before values of it can be converted.
    /// Built-in scalars never do; text-like built-ins are assumed text unless a row says otherwise.
    pub fn knows(&self, oid: u32) -> bool {
        self.kinds.contains_key(&oid)
    }

    /// Learns a type from its `pg_type` row. Domains resolve to their base type's conversion
    /// (a domain over numeric stays a JSON number); the base type's row must be added first, or
    /// be a built-in scalar.
    pub fn add(&mut self, row: &PgTypeRow) {
        let kind = if let Some(k) = BUILTIN_SCALARS.iter().find(|(o, _)| *o == row.oid) {
            k.1
        } else if row.typtype == b'd' {
            self.kind(row.typbasetype)
        } else if row.typcategory == b'A' && row.typelem != 0 {
            TypeKind::Array { element: row.typelem, delimiter: row.typdelim }
        } else {
            TypeKind::Text
        };
        self.kinds.insert(row.oid, kind);
        let base = if row.typtype == b'd' { self.base_type(row.typbasetype) } else { 0 };
        self.details.insert(row.oid, TypeDetails { typtype: row.typtype, base, enum_labels: row.enum_labels.clone() });
    }

    /// The type `oid` stands for: a domain's base type (through domains over domains), else itself.
    pub fn base_type(&self, oid: u32) -> u32 {
        match self.details.get(&oid) {
            Some(d) if d.typtype == b'd' && d.base != 0 => d.base,
            _ => oid,
        }
    }

    /// What its `pg_type` row said of a type (`None` for built-in scalars and unknown types).
    pub fn details(&self, oid: u32) -> Option<&TypeDetails> {
        self.details.get(&oid)
    }

    /// The conversion for a type; unknown types are converted as text (never an error, never lossy).
    pub fn kind(&self, oid: u32) -> TypeKind {
        self.kinds.get(&oid).copied().unwrap_or(TypeKind::Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(oid: u32, typtype: u8, cat: u8, elem: u32, base: u32) -> PgTypeRow {
        PgTypeRow {
            oid,
            typtype,
            typcategory: cat,
            typelem: elem,
            typbasetype: base,
            typdelim: b',',
            enum_labels: vec![],
        }
    }

    #[test]
    fn classifies_rows() {
        let mut r = TypeRegistry::new();
        assert_eq!(r.kind(1700), TypeKind::Numeric);
        assert_eq!(r.kind(25), TypeKind::Text);
        r.add(&row(1007, b'b', b'A', 23, 0));
        assert_eq!(r.kind(1007), TypeKind::Array { element: 23, delimiter: b',' });
        r.add(&row(70000, b'd', b'N', 0, 1700));
        assert_eq!(r.kind(70000), TypeKind::Numeric);
        r.add(&row(70001, b'e', b'E', 0, 0));
        assert_eq!(r.kind(70001), TypeKind::Text);
        r.add(&row(70002, b'c', b'C', 0, 0));
        assert_eq!(r.kind(70002), TypeKind::Text);
        assert!(r.knows(16) && !r.knows(99999));
        // A domain over a domain stands for the first one's base type.
        r.add(&row(70003, b'd', b'N', 0, 70000));
        assert_eq!((r.base_type(70003), r.base_type(70000), r.base_type(1700)), (1700, 1700, 1700));
        assert_eq!(r.details(70001).map(|d| d.typtype), Some(b'e'));
    }
}
