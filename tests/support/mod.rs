#![allow(dead_code)]
pub mod allocator;
pub mod cgroups;
