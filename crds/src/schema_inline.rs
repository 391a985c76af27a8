//! Hand-written schemas for types the API writes inline (a leaf: it names nothing of the crate).

/// A hand-written [`schemars::JsonSchema`] impl for a type whose schema is always written inline,
/// named after the type: `inline_schema!(Type, |generator| schema)`.
macro_rules! inline_schema {
    ($ty:ident, |$generator:pat_param| $schema:expr) => {
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema($generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                $schema
            }
        }
    };
}
pub(crate) use inline_schema;
