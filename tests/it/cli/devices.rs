//! `gpumem devices`: the simulated devices it lists, as text and JSON, and a missing device.

use super::{gpumem, stderr};

#[test]
fn devices_lists_the_simulated_device() {
    let out = gpumem(&["devices", "--backend", "sim"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Simulated H100 (simulated)"), "{text}");
    assert!(text.contains("80.00 GiB"), "{text}");
}

#[test]
fn devices_json_is_an_array_of_devices() {
    let out = gpumem(&[
        "devices",
        "--backend",
        "sim",
        "--sim-devices",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = json.as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["index"], 1);
    assert_eq!(devices[0]["simulated"], true);
    assert!(devices[0]["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert_eq!(devices[0]["free_bytes"], devices[0]["total_memory_bytes"]);
}

#[test]
fn a_missing_device_exits_2_naming_those_that_exist() {
    let out = gpumem(&["devices", "--backend", "sim", "--devices", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("device 7 does not exist (device 0 exists)"),
        "{err}"
    );
}
