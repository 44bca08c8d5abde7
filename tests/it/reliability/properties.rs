//! Property tests over the same checks the fuzz targets run, with inputs built from each
//! format's grammar (tokens near the edges: zero, 2^40, u64::MAX, signs, exponents, unknown
//! keys and types) so CI explores beyond the committed corpus on every run.

use super::fuzz_checks;
use proptest::prelude::*;

fn trace_token() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..12).prop_map(|n| n.to_string()),
        Just("0".to_string()),
        Just("1099511627776".to_string()),
        Just("1099511627777".to_string()),
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-3".to_string()),
        Just("+3".to_string()),
        Just("1e3".to_string()),
        Just("x".to_string()),
        "[0-9]{1,25}",
    ]
}

fn trace_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (trace_token(), trace_token(), trace_token())
            .prop_map(|(id, size, stream)| format!("a {id} {size} {stream}")),
        3 => trace_token().prop_map(|id| format!("f {id}")),
        1 => Just(String::new()),
        1 => Just("# {\"events\": 18446744073709551615, \"allocs\": 99}".to_string()),
        1 => Just("# {not json".to_string()),
        1 => (trace_token(), trace_token()).prop_map(|(id, size)| format!("a {id} {size}")),
        1 => "[a-z#]{1,3}( [0-9a-z-]{1,6}){0,5}",
    ]
}

fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("true".to_string()),
        Just("\"off\"".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("0.9".to_string()),
        Just("1.5".to_string()),
        Just("nan".to_string()),
        Just("\"2GiB\"".to_string()),
        Just("\"10ms\"".to_string()),
        Just("\"12 parsecs\"".to_string()),
        Just("[0, 1]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("1979-05-27T07:32:00Z".to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        "\"[0-9.]{1,6}[kmgtsh]{0,3}\"",
    ]
}

/// Every key a config file may set, as the parser knows them.
use gpumem::manager::config_keys;

fn toml_key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(config_keys().collect::<Vec<_>>()).prop_map(str::to_string),
        1 => "[a-z_.]{1,12}",
        1 => Just("\"a\\nb\"".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_trace_text_parses_or_is_rejected_in_one_line(lines in prop::collection::vec(trace_line(), 0..40)) {
        fuzz_checks::trace(lines.join("\n").as_bytes());
    }

    #[test]
    fn any_bytes_as_a_trace(data in prop::collection::vec(any::<u8>(), 0..400)) {
        fuzz_checks::trace(&data);
    }

    #[test]
    fn any_config_text_loads_or_is_rejected(
        entries in prop::collection::vec((toml_key(), toml_value()), 0..12),
        as_variables in any::<bool>(),
    ) {
        let text: Vec<String> = if as_variables {
            entries
                .iter()
                .map(|(k, v)| format!("{}={}", k.replace('.', "_"), v.trim_matches('"')))
                .collect()
        } else {
            entries.iter().map(|(k, v)| format!("{k} = {v}")).collect()
        };
        let mut data = vec![u8::from(as_variables)];
        data.extend(text.join("\n").bytes());
        fuzz_checks::config(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_operations_and_faults_keep_the_allocator_consistent(
        data in prop::collection::vec(any::<u8>(), 1..1500)
    ) {
        fuzz_checks::allocator(&data);
    }
}
