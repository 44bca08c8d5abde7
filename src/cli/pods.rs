//! `gpumem serve`'s node-agent flags: where pods' names come from (`--pod-source`), the node,
//! the proc root, the API server, this gpumem's own pod (the downward API), and the hidden
//! test-only NVML fixture. Checked before anything is opened; bad input is one line, exit 2.

use super::CliError;
use clap::Args;
use gpumem_observe::collect::Collector;
use gpumem_observe::pods::{KubeConfig, KubeSettings, PodDirectory, DEFAULT_MIN_GAP};
use gpumem_wire::ThisPod;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub(super) struct PodFlags {
    /// Name each GPU process's pod (namespace, pod and container labels): kubernetes (the API
    /// server's list of this node's pods, with the pod's ServiceAccount), none, or auto
    /// (kubernetes when KUBERNETES_SERVICE_HOST and GPUMEM_NODE_NAME are set). See
    /// docs/node-agent.md.
    #[arg(
        long,
        env = "GPUMEM_POD_SOURCE",
        default_value = "auto",
        value_parser = ["auto", "kubernetes", "none"],
        value_name = "SOURCE"
    )]
    pod_source: String,

    /// The node whose pods are listed (the downward API's spec.nodeName).
    #[arg(long, env = "GPUMEM_NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,

    /// Where processes are looked up: the host's /proc (the default /proc is the host's with
    /// hostPID: true; a host /proc mounted elsewhere can be named here).
    #[arg(long, env = "GPUMEM_PROC_ROOT", value_name = "DIR")]
    proc_root: Option<PathBuf>,

    /// How often the node's pod list is fetched when nothing asks sooner (a process in a pod
    /// the list does not know asks at once, at most every 5s).
    #[arg(
        long,
        env = "GPUMEM_POD_REFRESH",
        default_value = "30s",
        value_name = "DURATION"
    )]
    pod_refresh: String,

    /// The API server (`https://HOST[:PORT]`); default from KUBERNETES_SERVICE_HOST and
    /// KUBERNETES_SERVICE_PORT, as in a pod.
    #[arg(long, env = "GPUMEM_KUBERNETES_URL", value_name = "URL")]
    kubernetes_url: Option<String>,

    /// The API server's CA (PEM); default the ServiceAccount's ca.crt.
    #[arg(long, env = "GPUMEM_KUBERNETES_CA", value_name = "FILE")]
    kubernetes_ca: Option<PathBuf>,

    /// The bearer token's file, read again before every request; default the
    /// ServiceAccount's token.
    #[arg(long, env = "GPUMEM_KUBERNETES_TOKEN_FILE", value_name = "FILE")]
    kubernetes_token_file: Option<PathBuf>,

    /// This gpumem's own pod (the downward API's metadata.name), with --pod-namespace: shown
    /// on the page, in /api/v1/snapshot and in flight records.
    #[arg(long, env = "GPUMEM_POD_NAME", value_name = "NAME")]
    pod_name: Option<String>,
    /// This gpumem's own pod's namespace (the downward API's metadata.namespace); give both.
    #[arg(long, env = "GPUMEM_POD_NAMESPACE", value_name = "NAMESPACE")]
    pod_namespace: Option<String>,

    /// Tests only: read what NVML would say from this JSON file instead of NVML.
    #[arg(
        long,
        env = "GPUMEM_TEST_NVML_FIXTURE",
        value_name = "FILE",
        hide = true
    )]
    pub(super) test_nvml_fixture: Option<PathBuf>,
}

/// The node agent's settings, checked.
pub(super) struct PodSetup {
    proc_root: Option<PathBuf>,
    kubernetes: Option<(KubeSettings, Duration)>,
    this_pod: Option<ThisPod>,
}

impl PodFlags {
    /// Checks every flag; opens nothing.
    pub(super) fn validate(&self) -> Result<PodSetup, CliError> {
        if let Some(root) = &self.proc_root {
            if !root.is_dir() {
                return Err(CliError::usage(format!(
                    "--proc-root: {} is not a directory",
                    root.display()
                )));
            }
        }
        if let Some(fixture) = &self.test_nvml_fixture {
            gpumem_observe::collect::nvml_fixture::check(fixture)
                .map_err(|e| CliError::usage(format!("--test-nvml-fixture: {e}")))?;
        }
        let refresh = gpumem::units::parse_duration(&self.pod_refresh)
            .map_err(|e| CliError::usage(format!("--pod-refresh: {e}")))?;
        if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&refresh) {
            return Err(CliError::usage(format!(
                "--pod-refresh: {} is outside 1s to 24h",
                self.pod_refresh
            )));
        }
        let config = KubeConfig {
            url: self.kubernetes_url.clone(),
            ca_file: self.kubernetes_ca.clone(),
            token_file: self.kubernetes_token_file.clone(),
            node: self.node_name.clone(),
        };
        let kubernetes = match self.pod_source.as_str() {
            "kubernetes" => Some(
                config
                    .settings()
                    .map_err(|e| CliError::usage(format!("--pod-source kubernetes: {e}")))?,
            ),
            "auto" if self.in_cluster() => match config.settings() {
                Ok(settings) => Some(settings),
                Err(error) => {
                    tracing::warn!(
                        "pods: not naming pods ({error}); --pod-source kubernetes makes this an error"
                    );
                    None
                }
            },
            _ => None,
        };
        Ok(PodSetup {
            proc_root: self.proc_root.clone(),
            kubernetes: kubernetes.map(|k| (k, refresh)),
            this_pod: self.this_pod()?,
        })
    }

    /// `auto`'s test: an API server to ask and a node to ask about.
    fn in_cluster(&self) -> bool {
        let set = |v: Option<String>| v.is_some_and(|v| !v.trim().is_empty());
        (set(std::env::var("KUBERNETES_SERVICE_HOST").ok()) || self.kubernetes_url.is_some())
            && set(self.node_name.clone())
    }

    fn this_pod(&self) -> Result<Option<ThisPod>, CliError> {
        let clean = |v: &Option<String>| {
            v.as_deref()
                .map(|v| gpumem_wire::process::clean_text(v, 253))
                .filter(|v| !v.is_empty())
        };
        match (clean(&self.pod_namespace), clean(&self.pod_name)) {
            (Some(namespace), Some(pod)) => Ok(Some(ThisPod { namespace, pod })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(CliError::usage(
                "GPUMEM_POD_NAMESPACE is set without GPUMEM_POD_NAME: give both (the downward API's metadata.namespace and metadata.name)",
            )),
            (None, Some(_)) => Err(CliError::usage(
                "GPUMEM_POD_NAME is set without GPUMEM_POD_NAMESPACE: give both (the downward API's metadata.name and metadata.namespace)",
            )),
        }
    }
}

impl PodSetup {
    /// Sets the collector up as the node agent: the proc root, the pod directory (its thread
    /// starts here and asks the API server at once), this pod.
    pub(super) fn apply(self, collector: &mut Collector) -> Result<(), CliError> {
        if let Some(root) = self.proc_root {
            collector.use_proc_root(root);
        }
        if let Some((settings, refresh)) = self.kubernetes {
            let directory = PodDirectory::spawn(settings, refresh, DEFAULT_MIN_GAP.min(refresh))
                .map_err(|e| CliError::runtime(format!("could not start the pod lookup: {e}")))?;
            collector.attribute_pods(directory);
        }
        if let Some(pod) = self.this_pod {
            tracing::info!("this gpumem runs in pod {}/{}", pod.namespace, pod.pod);
            collector.set_this_pod(pod);
        }
        Ok(())
    }
}
