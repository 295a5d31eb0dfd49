//! `HA_NCCL_MR_POLICY=eager`: `regMr` registers the buffer on the standby's device too, at
//! once (two registrations for a connection with a standby). One test per binary: the policy
//! is read once per process.

mod common;
mod mr_policy;

#[test]
fn eager_registers_on_the_primary_and_the_standby_at_once() {
    mr_policy::init("eager");
    assert_eq!(mr_policy::registrations_added_by_one_reg_mr(), 2);
}
