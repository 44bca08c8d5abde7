//! The chart rendered by Helm's library and checked object by object, one module per thing
//! checked: the node agent as the issue asks for it (DaemonSet, narrow RBAC, Service,
//! ServiceMonitor relabelled by node) with its command run here for real (`node_agent`), the
//! PrometheusRule and dashboard ConfigMap equal to the files under grafana/ they are read from and
//! the packaged chart carrying those files (`grafana`), every value combination the README
//! documents linted and validated (`combinations`), the defaults a real cluster needs and the
//! values schema (`defaults`), and every value documented (`value_docs`).

mod combinations;
mod defaults;
mod grafana;
mod node_agent;
mod value_docs;
