//! What the tests that run the planner's specs through the engine share.

use std::path::{Path, PathBuf};

use siphon_engine::{EngineOptions, ShardingPlan};
use siphon_runtime::{Client, ClientOptions, Plugin};

/// A client of the CPU plugin (`SIPHON_PJRT_PLUGIN`, which scripts/test.sh sets) with 8
/// devices; `None`, with a note naming `what` is skipped, when the variable is unset.
pub fn cpu_client(what: &str) -> Option<Client> {
    let Some(plugin) = std::env::var_os("SIPHON_PJRT_PLUGIN") else {
        eprintln!("note: SIPHON_PJRT_PLUGIN is unset; skipping {what}");
        return None;
    };
    let plugin = Plugin::load(Path::new(&plugin)).unwrap();
    Some(Client::new(&plugin, ClientOptions::new().cpu_device_count(8)).unwrap())
}

/// fixtures/models.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models")
}

/// Engine options that run `plan`: its mesh, and its weight and input specs.
pub fn planned_options(plan: &siphon_plan::Plan) -> EngineOptions {
    EngineOptions {
        mesh: plan.mesh.clone(),
        plan: ShardingPlan::Explicit {
            params: plan.param_specs().iter().cloned().collect(),
            input: Some(plan.input_spec.clone()),
        },
        ..EngineOptions::default()
    }
}
