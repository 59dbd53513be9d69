//! The tollgate binary and `serve::start` through every door: one test
//! binary, a module per area, sharing `common` (servers on free loopback
//! ports, a Redis launcher, certificates).

mod check_config;
mod cli;
mod common;
mod deploy_kit;
mod doors;
mod envoy_answers;
mod envoy_conformance;
mod envoy_env;
mod envoy_stats;
mod file_limit;
mod flood;
mod gateway;
mod grpc;
mod grpc_frames;
mod http;
mod in_process;
mod live_page;
mod overload;
mod peak;
mod real_envoy;
mod redis;
mod redis_tls;
mod reliability;
mod reload;
mod rlqs_state;
mod shed;
mod shedders;
mod simulate;
mod tls;
mod utilization;
mod xds;
