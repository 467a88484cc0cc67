//! pg_cdc's JSON event as the other formats read it: parsed once, borrowing from the event's
//! bytes (names and raw values), every field known. Unknown fields are refused, so a field the
//! JSON event gains cannot be left out of another format unnoticed (the tests encode every kind).
use serde_json::value::RawValue;

/// A JSON object key, borrowed from the event when it has no escape.
#[derive(Debug)]
pub(crate) struct Name<'a>(pub(crate) std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Name<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Name<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(std::borrow::Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// A JSON object's fields in their order.
#[derive(Debug)]
pub(crate) struct Fields<'a>(pub(crate) Vec<(Name<'a>, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(16));
                while let Some((k, v)) = m.next_entry::<Name<'a>, &'a RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// The JSON event, as the envelope schema reads it. Unknown fields are refused, so a field the
/// JSON event gains cannot be left out of Avro events unnoticed (the tests encode every kind).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JsonEvent<'a> {
    #[serde(borrow)]
    pub(crate) metadata: Metadata<'a>,
    #[serde(borrow)]
    pub(crate) before: Option<Fields<'a>>,
    #[serde(borrow)]
    pub(crate) after: Option<Fields<'a>>,
    /// Left out: `before` and `after` carry both images.
    #[allow(dead_code)]
    pub(crate) diff: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    pub(crate) compliance: Option<Compliance<'a>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Metadata<'a> {
    #[serde(borrow)]
    pub(crate) source: Name<'a>,
    #[serde(borrow)]
    pub(crate) database: Name<'a>,
    #[serde(borrow)]
    pub(crate) schema: Name<'a>,
    #[serde(borrow)]
    pub(crate) table: Name<'a>,
    #[serde(borrow)]
    pub(crate) operation: Name<'a>,
    #[serde(borrow)]
    pub(crate) timestamp: Name<'a>,
    pub(crate) lsn: u64,
    pub(crate) commit_lsn: u64,
    pub(crate) transaction_id: u64,
    pub(crate) user: Option<String>,
    pub(crate) session_id: Option<String>,
    pub(crate) client_ip: Option<String>,
    pub(crate) application_name: Option<String>,
    pub(crate) query: Option<String>,
    pub(crate) filter_matched: Option<String>,
    pub(crate) filter_transition: Option<String>,
    pub(crate) transaction: Option<Transaction>,
    pub(crate) unchanged_toast_columns: Option<Vec<String>>,
    pub(crate) truncate: Option<Truncate>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Transaction {
    pub(crate) id: u64,
    pub(crate) commit_lsn: u64,
    pub(crate) event_index: u64,
    pub(crate) event_count: u64,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Truncate {
    pub(crate) cascade: bool,
    pub(crate) restart_identity: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Compliance<'a> {
    #[serde(borrow)]
    pub(crate) audit_id: Name<'a>,
    pub(crate) retention_until: Option<String>,
    pub(crate) key_version: Option<u64>,
    pub(crate) pii_tokenized: Option<Vec<String>>,
    pub(crate) pii_hashed: Option<Vec<String>>,
    pub(crate) pii_redacted: Option<Vec<String>>,
    pub(crate) pii_removed: Option<Vec<String>>,
}
