#![doc = include_str!("../../docs/proxies.md")]
