//! Data-parallel training: `W` workers, each with its own copy of the model, on
//! `burn-collective`'s all-reduce. Workers are threads of one process ([`train_workers`]) or of
//! several processes on one machine or several ([`train_cluster`], through burn-collective's
//! orchestrator). Every step each worker takes its contiguous share of the global batch,
//! computes the gradient of its part of the global loss (its windows' sum divided by the global
//! count, so that the parts add up to the one-worker loss), and the gradients are summed across
//! workers; every worker then applies the same AdamW update to the same gradient (global-norm
//! clipping included), so the copies stay equal.
//!
//! The gradients travel as one flat vector per step, the parameters in the modules' visiting
//! order (Burn's `ParamId`s differ between copies made independently). Collectives run on the
//! inner (non-autodiff) backend. Every exchange has a deadline: a worker that dies or cannot be
//! reached makes the others fail with [`TrainError::Collective`] instead of waiting forever.
//!
//! [`train_workers`]: crate::train_workers
//! [`train_cluster`]: crate::train_cluster

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorPrimitive;
use burn_collective::{all_reduce, finish_collective, register, CollectiveConfig, CollectiveError, PeerId, ReduceOperation};

use crate::TrainError;

/// How long a worker waits for the others, in joining and in each exchange, unless told
/// otherwise. Worker 0 validates and writes the run directory while the others wait, and the
/// processes of a run may be started by hand one after the other, so this is generous.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// The workers of a data-parallel run, as this process sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workers {
    /// Workers in this process, one thread each.
    pub threads: usize,
    /// The other processes, for a run over several (`None`: this process alone).
    pub cluster: Option<Cluster>,
    /// How long a worker waits for the others before it stops with an error.
    pub timeout: Duration,
}

impl Workers {
    /// `threads` workers in this process and no other process.
    pub fn threads(threads: usize) -> Self {
        Workers { threads, cluster: None, timeout: DEFAULT_PEER_TIMEOUT }
    }

    /// All workers of the run: this process's threads times the processes.
    pub fn world(&self) -> usize {
        self.threads * self.cluster.as_ref().map_or(1, |c| c.processes)
    }

    /// This process's workers, one per thread, sharing what they need to reach the others.
    pub(crate) fn peers(&self) -> Vec<Peer> {
        let process = self.cluster.as_ref().map_or(0, |c| c.process);
        let link = (self.world() > 1).then(|| {
            Arc::new(Link {
                threads: self.threads,
                cluster: self.cluster.clone(),
                timeout: self.timeout,
                addresses: Mutex::new(Vec::new()),
            })
        });
        (0..self.threads).map(|thread| Peer { rank: process * self.threads + thread, world: self.world(), link: link.clone() }).collect()
    }
}

/// One process of a run over several processes (on one machine or several): burn-collective's
/// orchestrator runs in process 0 at `coordinator`; the processes exchange gradients directly,
/// each serving them at its `listen` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The number of processes.
    pub processes: usize,
    /// This process, `0..processes`. Process 0 runs the orchestrator, validates, reports and
    /// writes the run directory.
    pub process: usize,
    /// Where process 0 runs the orchestrator, as every process reaches it.
    pub coordinator: SocketAddr,
    /// This process's address for the gradient exchange, as the other processes reach it.
    pub listen: SocketAddr,
}

impl Cluster {
    /// Process `process` of `processes`, with the coordinator at `coordinator` (`host:port`).
    /// `listen` (`host:port`) defaults to the coordinator's host and its port plus 1 plus
    /// `process`, which serves a run on one machine; on several, every process but 0 needs its
    /// own.
    ///
    /// # Errors
    /// [`TrainError::Config`], naming the value, for a rank outside the world, an address
    /// that is not `host:port` or does not resolve, and a missing `listen` where the default
    /// cannot be right.
    pub fn new(processes: usize, process: usize, coordinator: &str, listen: Option<&str>) -> Result<Self, TrainError> {
        let config = |why: String| TrainError::Config { why };
        if processes < 1 || process >= processes {
            return Err(config(format!("--rank {process} is not below --world-size {processes}")));
        }
        let coordinator_addr = resolve("--coordinator", coordinator)?;
        let listen = match listen {
            Some(l) => resolve("--listen", l)?,
            None => {
                if process > 0 && !coordinator_addr.ip().is_loopback() {
                    return Err(config(format!(
                        "--rank {process} needs --listen HOST:PORT, its own address as the other processes reach it \
                         (the default, the coordinator's host {}, is another machine)",
                        coordinator_addr.ip()
                    )));
                }
                let port = u16::try_from(usize::from(coordinator_addr.port()) + 1 + process)
                    .map_err(|_| config(format!("--coordinator {coordinator}: its port leaves no port for --rank {process}")))?;
                SocketAddr::new(coordinator_addr.ip(), port)
            }
        };
        Ok(Cluster { processes, process, coordinator: coordinator_addr, listen })
    }
}

fn resolve(flag: &str, text: &str) -> Result<SocketAddr, TrainError> {
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| TrainError::Config { why: format!("{flag} {text:?}: not a host:port that resolves ({e})") })?
        .collect();
    // IPv4 first: the processes tell each other their addresses as four numbers (see `join`).
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| TrainError::Config { why: format!("{flag} {text:?}: resolves to no address") })
}

/// One worker's place in a data-parallel run: `rank` of `world` workers.
#[derive(Debug, Clone)]
pub struct Peer {
    /// This worker, `0..world`; worker 0 validates, reports and writes the run directory.
    pub rank: usize,
    /// The number of workers.
    pub world: usize,
    link: Option<Arc<Link>>,
}

/// What a worker of a run with others needs to reach them.
#[derive(Debug)]
struct Link {
    threads: usize,
    cluster: Option<Cluster>,
    timeout: Duration,
    /// Every process's exchange address, learnt on joining, to name the ones that cannot be
    /// reached when an exchange fails.
    addresses: Mutex<Vec<Option<SocketAddr>>>,
}

impl Peer {
    /// The only worker of an ordinary run: no collective at all.
    pub fn alone() -> Self {
        Peer { rank: 0, world: 1, link: None }
    }

    /// Whether this worker writes files and reports progress.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    fn id(&self) -> PeerId {
        PeerId::from(self.rank as u32)
    }

    /// The first worker of this process, which starts what the process shares.
    fn first_of_process(&self) -> bool {
        self.link.as_ref().is_some_and(|l| self.rank.is_multiple_of(l.threads))
    }

    fn error(&self, what: &str, e: impl std::fmt::Debug) -> TrainError {
        TrainError::Collective { rank: self.rank, why: format!("{what}: {e:?}") }
    }

    /// This worker's share of a batch's windows: a contiguous block, the first `len % world`
    /// workers one window larger.
    pub fn shard<'a, T>(&self, batch: &'a [T]) -> &'a [T] {
        let (base, extra) = (batch.len() / self.world, batch.len() % self.world);
        let start = self.rank * base + self.rank.min(extra);
        &batch[start..start + base + usize::from(self.rank < extra)]
    }

    /// Runs `call`, one exchange with the other workers, on a thread of its own, and waits for it
    /// at most the run's timeout: burn-collective's calls block until every worker has made
    /// the same call, and wait forever for one that has died. A call that times out is left
    /// behind; the error ends the run, and with it the process.
    fn within<T: Send + 'static>(
        &self,
        what: &str,
        call: impl FnOnce() -> Result<T, CollectiveError> + Send + 'static,
    ) -> Result<T, TrainError> {
        let timeout = self.link.as_ref().expect("only workers with others exchange").timeout;
        let (send, receive) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(format!("{EXCHANGE_THREAD}{}", self.rank))
            .spawn(move || {
                let _ = send.send(call());
            })
            .map_err(|e| self.error(what, e))?;
        match receive.recv_timeout(timeout) {
            Ok(Ok(v)) => Ok(v),
            // Between processes, an error after joining is a lost connection (burn-collective's
            // servers stop when a peer's socket closes).
            Ok(Err(e)) if self.link.as_ref().is_some_and(|l| l.cluster.is_some()) => Err(self.lost(
                what,
                &match e {
                    CollectiveError::LocalServerMissing => "the exchange stopped".to_string(),
                    e => format!("{e:?}"),
                },
            )),
            Ok(Err(e)) => Err(self.error(what, e)),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(self.lost(what, &format!("no answer within {} s", timeout.as_secs_f64()))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.lost(what, "the exchange broke off")),
        }
    }

    /// The error for an exchange that did not complete, naming the processes that no longer
    /// accept connections (a process that died, or a machine that cannot be reached).
    fn lost(&self, what: &str, how: &str) -> TrainError {
        let link = self.link.as_ref().expect("only workers with others exchange");
        let who = match &link.cluster {
            None => "another worker of this process stopped".to_string(),
            Some(cluster) => {
                let addresses = link.addresses.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let others: Vec<(usize, SocketAddr)> =
                    addresses.iter().enumerate().filter(|&(p, _)| p != cluster.process).filter_map(|(p, a)| a.map(|a| (p, a))).collect();
                let name = |(p, a): &(usize, SocketAddr)| format!("--rank {p} ({a})");
                let gone: Vec<String> = others.iter().filter(|(_, a)| !answers(a)).map(name).collect();
                if addresses.is_empty() {
                    format!("not every one of the {} processes joined", cluster.processes)
                } else if gone.is_empty() {
                    format!(
                        "{} still accept{} connections (one may be stuck or slow: --peer-timeout sets the wait)",
                        others.iter().map(name).collect::<Vec<_>>().join(", "),
                        if others.len() == 1 { "s" } else { "" }
                    )
                } else {
                    format!("{} cannot be reached", gone.join(", "))
                }
            }
        };
        TrainError::Collective { rank: self.rank, why: format!("{what}: {how}; {who}") }
    }

    /// Joins the other workers (nothing for a worker alone): process 0 starts the orchestrator,
    /// then every worker registers, and the processes tell each other their addresses.
    pub(crate) fn join<B: Backend>(&self, device: &B::Device) -> Result<(), TrainError> {
        let Some(link) = &self.link else { return Ok(()) };
        let mut config = CollectiveConfig::default().with_num_devices(link.threads);
        if let Some(cluster) = &link.cluster {
            if self.first_of_process() {
                if cluster.process == 0 {
                    start_coordinator(cluster.coordinator.port())?;
                }
                port_is_free("--listen", cluster.listen.port())?;
            }
            config = config
                .with_num_nodes(cluster.processes as u32)
                .with_global_address(format!("ws://{}", cluster.coordinator).parse().expect("any text is an address"))
                .with_node_address(format!("ws://{}", cluster.listen).parse().expect("any text is an address"))
                .with_data_service_port(cluster.listen.port());
        }
        let (id, on) = (self.id(), device.clone());
        self.within("joining the other workers", move || register::<B>(id, on, config))?;
        if let Some(cluster) = &link.cluster {
            let mut mine = vec![0.0; 5 * cluster.processes];
            if let (true, IpAddr::V4(ip)) = (self.first_of_process(), cluster.listen.ip()) {
                for (k, octet) in ip.octets().into_iter().enumerate() {
                    mine[5 * cluster.process + k] = f64::from(octet);
                }
                mine[5 * cluster.process + 4] = f64::from(cluster.listen.port());
            }
            let all = self.sum_values::<B>("telling each other their addresses", &mine, device)?;
            let addresses = all
                .chunks(5)
                .map(|a| {
                    let octet = |k: usize| a[k] as u8;
                    (a[4] > 0.0).then(|| SocketAddr::new(Ipv4Addr::new(octet(0), octet(1), octet(2), octet(3)).into(), a[4] as u16))
                })
                .collect();
            *link.addresses.lock().unwrap_or_else(|e| e.into_inner()) = addresses;
        }
        Ok(())
    }

    /// Leaves the collective.
    pub(crate) fn leave<B: Backend>(&self) -> Result<(), TrainError> {
        if self.link.is_some() {
            let id = self.id();
            self.within("leaving the other workers", move || finish_collective::<B>(id))?;
        }
        Ok(())
    }

    /// `t` summed over the workers, element by element.
    fn sum<B: Backend>(&self, t: Tensor<B, 1>, what: &str) -> Result<Tensor<B, 1>, TrainError> {
        let (id, t) = (self.id(), t.into_primitive().tensor());
        let summed = self.within(what, move || all_reduce::<B>(id, t, ReduceOperation::Sum))?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
    }

    /// `values` summed over the workers, element by element; `what` names them in an error.
    pub(crate) fn sum_values<B: Backend>(&self, what: &str, values: &[f64], device: &B::Device) -> Result<Vec<f64>, TrainError> {
        let Some(link) = &self.link else { return Ok(values.to_vec()) };
        // The exchange between processes cuts a vector into one piece per process.
        let mut padded = values.to_vec();
        padded.resize(values.len().max(link.cluster.as_ref().map_or(1, |c| c.processes)), 0.0);
        let n = padded.len();
        let t = Tensor::<B, 1>::from_data(TensorData::new(padded, [n]).convert::<B::FloatElem>(), device);
        let summed = self.sum(t, what)?.into_data().convert::<f64>().into_vec::<f64>().expect("converted to f64");
        Ok(summed[..values.len()].to_vec())
    }

    /// Every parameter's gradient summed over the workers, in `model`'s visiting order (the
    /// same on every worker), as one vector. A parameter without a gradient on this worker
    /// takes part with zeros, so that every worker sends the same vector length.
    pub(crate) fn sum_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<GradientsParams, TrainError> {
        if self.link.is_none() {
            return Ok(grads);
        }
        let mut gather = Gather::<B> { grads: &mut grads, parts: Vec::new() };
        model.visit(&mut gather);
        let sizes: Vec<usize> = gather.parts.iter().map(|t| t.dims()[0]).collect();
        let summed = self.sum(Tensor::cat(gather.parts, 0), "summing gradients")?;
        let mut scatter = Scatter::<B> { grads: &mut grads, parts: summed.split_with_sizes(sizes, 0).into_iter() };
        model.visit(&mut scatter);
        Ok(grads)
    }
}

/// The name every exchange thread's name starts with: the command keeps the panics of those
/// threads (burn-collective's reaction to a lost worker) out of its one-line error.
pub const EXCHANGE_THREAD: &str = "mamba2-exchange-";

/// Starts burn-collective's orchestrator on `port`, once per process, on a thread of its own.
fn start_coordinator(port: u16) -> Result<(), TrainError> {
    static STARTED: OnceLock<u16> = OnceLock::new();
    match STARTED.get() {
        Some(&p) if p == port => return Ok(()),
        // It runs until the process ends: a later run cannot move it.
        Some(&p) => {
            return Err(TrainError::Config {
                why: format!("--coordinator port {port}: this process already runs the coordinator on port {p}"),
            })
        }
        None => {}
    }
    port_is_free("--coordinator", port)?;
    STARTED.get_or_init(|| {
        std::thread::Builder::new()
            .name("mamba2-coordinator".into())
            .spawn(move || {
                let runtime =
                    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a tokio runtime starts");
                runtime.block_on(burn_collective::start_global_orchestrator(port));
                // The orchestrator returns on Ctrl-C or SIGTERM, which it takes over from the
                // process: end the process as those signals would have.
                eprintln!("interrupted");
                std::process::exit(130);
            })
            .expect("a thread starts");
        port
    });
    Ok(())
}

/// Whether `port` can be served on every interface, as burn-collective's servers do: checked
/// first, since a server that fails to start leaves the others waiting.
fn port_is_free(flag: &str, port: u16) -> Result<(), TrainError> {
    TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
        .map(drop)
        .map_err(|e| TrainError::Config { why: format!("{flag}: port {port} cannot be served: {e}") })
}

struct Gather<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = self.grads.remove::<B::InnerBackend, D>(param.id).unwrap_or_else(|| param.val().inner().zeros_like());
        let n = grad.shape().num_elements();
        self.parts.push(grad.reshape([n]));
    }
}

struct Scatter<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    parts: std::vec::IntoIter<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let part = self.parts.next().expect("one part per parameter, as gathered");
        self.grads.register::<B::InnerBackend, D>(param.id, part.reshape(param.val().shape()));
    }
}

/// Whether a process still accepts connections at `address`, asked a few times over a second:
/// a peer that was killed breaks its links before the kernel has closed its listening socket,
/// so one answer right after the break can still come from a dying process.
fn answers(address: &SocketAddr) -> bool {
    (0..PROBES).all(|k| {
        if k > 0 {
            std::thread::sleep(PROBE_GAP);
        }
        TcpStream::connect_timeout(address, Duration::from_secs(2)).is_ok()
    })
}

/// How often, and how far apart, [`answers`] asks.
const PROBES: u32 = 10;
const PROBE_GAP: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order() {
        let batch: Vec<usize> = (0..32).collect();
        for world in 1..=5 {
            let peer = |rank| Peer { rank, world, link: None };
            let joined: Vec<usize> = (0..world).flat_map(|rank| peer(rank).shard(&batch).to_vec()).collect();
            assert_eq!(joined, batch, "world {world}");
            let sizes: Vec<usize> = (0..world).map(|rank| peer(rank).shard(&batch).len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "world {world}: {sizes:?}");
        }
    }

    #[test]
    fn cluster_addresses_default_on_one_machine_and_are_required_across_machines() {
        let c = Cluster::new(3, 2, "127.0.0.1:29400", None).unwrap();
        assert_eq!(c.listen, "127.0.0.1:29403".parse().unwrap());
        assert_eq!(Cluster::new(3, 0, "10.1.2.3:29400", None).unwrap().listen, "10.1.2.3:29401".parse().unwrap());
        let err = |r: Result<Cluster, TrainError>| r.unwrap_err().to_string();
        assert!(err(Cluster::new(2, 1, "10.1.2.3:29400", None)).contains("--rank 1 needs --listen"));
        assert!(err(Cluster::new(2, 2, "127.0.0.1:29400", None)).contains("--rank 2 is not below --world-size 2"));
        assert!(err(Cluster::new(2, 0, "no-port", None)).contains("--coordinator \"no-port\""));
        assert!(err(Cluster::new(2, 1, "127.0.0.1:65535", None)).contains("leaves no port"));
        assert_eq!(Cluster::new(2, 1, "10.1.2.3:29400", Some("10.1.2.4:5000")).unwrap().listen, "10.1.2.4:5000".parse().unwrap());
    }
}
