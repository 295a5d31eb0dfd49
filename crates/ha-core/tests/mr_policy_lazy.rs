//! `HA_NCCL_MR_POLICY=lazy` (the default): `regMr` registers on the primary's device only; the
//! standby's registration waits for the first failover that needs it. One test per binary.

mod common;
mod mr_policy;

#[test]
fn lazy_registers_on_the_primary_only() {
    mr_policy::init("lazy");
    assert_eq!(mr_policy::registrations_added_by_one_reg_mr(), 1);
}
