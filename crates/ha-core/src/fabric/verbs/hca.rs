//! An open RDMA device (HCA) shared by the protection domains of its ports, with its
//! async-event thread. The thread reads `ibv_get_async_event`, logs each event through
//! `tracing` and records it on the [`PortEvents`] of the fabric device it concerns: port
//! events by port number, QP and CQ events through the routes that queue pairs and completion
//! queues register here. It stops (and the context closes) when the last PD, CQ or QP of the
//! device is dropped.

use super::super::{FabricError, Result};
use super::context::{Context, DevAttr};
use super::events::{AsyncEventKind, PortEvents};
use super::ffi::{self, Wait, WakeFd};
use super::threads;
use ibverbs_sys as sys;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where events of this device go.
pub struct EventRoutes {
    name: String,
    /// Fabric devices on this HCA: (port number, its events).
    ports: Vec<(u8, Arc<PortEvents>)>,
    /// Live queue pairs by number.
    qps: Mutex<HashMap<u32, Arc<PortEvents>>>,
    /// Live completion queues by `ibv_cq` address.
    cqs: Mutex<HashMap<usize, Arc<PortEvents>>>,
}

impl EventRoutes {
    pub fn add_qp(&self, qpn: u32, ev: Arc<PortEvents>) {
        self.qps.lock().insert(qpn, ev);
    }
    pub fn remove_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }
    pub fn add_cq(&self, cq: usize, ev: Arc<PortEvents>) {
        self.cqs.lock().insert(cq, ev);
    }
    pub fn remove_cq(&self, cq: usize) {
        self.cqs.lock().remove(&cq);
    }

    fn deliver(&self, kind: AsyncEventKind, port: Option<u8>, qp_num: Option<u32>, cq: usize) {
        let targets: Vec<Arc<PortEvents>> = match (kind, port, qp_num) {
            (AsyncEventKind::DeviceFatal, _, _) => {
                self.ports.iter().map(|(_, e)| e.clone()).collect()
            }
            (_, Some(p), _) => self
                .ports
                .iter()
                .filter(|(n, _)| *n == p)
                .map(|(_, e)| e.clone())
                .collect(),
            (_, None, Some(q)) => self.qps.lock().get(&q).cloned().into_iter().collect(),
            _ => self.cqs.lock().get(&cq).cloned().into_iter().collect(),
        };
        let what = match (port, qp_num) {
            (Some(p), _) => format!("port {p}"),
            (None, Some(q)) => format!("QP {q:#x}"),
            _ if cq != 0 => "CQ".to_string(),
            _ => "device".to_string(),
        };
        if kind.is_error() {
            tracing::warn!(
                "NET/HA verbs: {}: async event {kind:?} on {what}",
                self.name
            );
        } else {
            tracing::info!(
                "NET/HA verbs: {}: async event {kind:?} on {what}",
                self.name
            );
        }
        for t in targets {
            t.record(kind, qp_num);
        }
    }
}

/// An open device and its event thread.
pub struct Hca {
    pub attr: DevAttr,
    pub routes: Arc<EventRoutes>,
    wake: Arc<WakeFd>,
    thread: Option<JoinHandle<()>>,
    // Last: closed after the thread has been joined.
    pub ctx: Arc<Context>,
}

impl Hca {
    /// Open device `index` of `list` and start its event thread. `ports` are the fabric
    /// devices on it; their health is refreshed from a port query now.
    pub fn open(
        list: &super::context::DeviceList,
        index: usize,
        ports: Vec<(u8, Arc<PortEvents>)>,
    ) -> Result<Hca> {
        let ctx = Arc::new(Context::open(list, index)?);
        let attr = ctx.query_device()?;
        for (p, ev) in &ports {
            let active = ctx
                .query_port(*p)
                .map(|a| a.state == sys::ibv_port_state::IBV_PORT_ACTIVE)
                .unwrap_or(false);
            ev.set_port_active(active);
        }
        let routes = Arc::new(EventRoutes {
            name: ctx.name().to_string(),
            ports,
            qps: Mutex::new(HashMap::new()),
            cqs: Mutex::new(HashMap::new()),
        });
        ffi::set_nonblocking(ctx.async_fd())
            .map_err(|e| FabricError::io(format!("{}: async fd", ctx.name()), e))?;
        let wake = Arc::new(WakeFd::new().map_err(|e| FabricError::io("eventfd", e))?);
        let (c, r, w) = (ctx.clone(), routes.clone(), wake.clone());
        let thread = threads::spawn(format!("ha-verbs-ev{index}"), move || {
            event_loop(&c, &r, &w)
        })?;
        Ok(Hca {
            attr,
            routes,
            wake,
            thread: Some(thread),
            ctx,
        })
    }

    pub fn raw(&self) -> *mut sys::ibv_context {
        self.ctx.raw()
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn event_loop(ctx: &Context, routes: &EventRoutes, wake: &WakeFd) {
    loop {
        match ffi::wait_readable(ctx.async_fd(), wake) {
            Ok(Wait::Stop) => return,
            Ok(Wait::Ready) => {}
            Err(e) => {
                tracing::warn!("NET/HA verbs: {}: async event fd: {e}", ctx.name());
                return;
            }
        }
        loop {
            let mut ev = sys::ibv_async_event::default();
            // SAFETY: live context (the owner joins this thread before closing it); `ev`
            // is a live out-parameter. Non-blocking fd: returns -1/EAGAIN when drained.
            if unsafe { sys::ibv_get_async_event(ctx.raw(), &mut ev) } != 0 {
                break;
            }
            let kind = AsyncEventKind::from_raw(ev.event_type);
            let (mut port, mut qp_num, mut cq) = (None, None, 0usize);
            // SAFETY: the union member read is the one `event_type` says is set; a QP or CQ
            // named by an unacknowledged event cannot be destroyed (destroy waits for the
            // ack below), so dereferencing it here is sound.
            unsafe {
                match kind {
                    AsyncEventKind::PortActive
                    | AsyncEventKind::PortErr
                    | AsyncEventKind::LidChange
                    | AsyncEventKind::PkeyChange
                    | AsyncEventKind::SmChange
                    | AsyncEventKind::ClientReregister
                    | AsyncEventKind::GidChange => {
                        port = u8::try_from(ev.element.port_num).ok();
                    }
                    k if k.is_qp_event() && !ev.element.qp.is_null() => {
                        qp_num = Some((*ev.element.qp).qp_num);
                    }
                    AsyncEventKind::CqErr => cq = ev.element.cq as usize,
                    _ => {}
                }
            }
            routes.deliver(kind, port, qp_num, cq);
            // SAFETY: acknowledges the event obtained above, exactly once.
            unsafe { sys::ibv_ack_async_event(&mut ev) };
        }
    }
}
