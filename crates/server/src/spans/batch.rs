//! Exporting decision spans in batches, on the tokio runtime, without ever
//! holding a decision up.
//!
//! A decision that ends a span only `try_send`s it into a bounded queue
//! ([`BatchOptions::max_queue`]): when the queue is full (the collector is
//! slow or down) the span is dropped and counted in
//! `tollgate_spans_dropped_total`, never waited for. One task drains the
//! queue and hands the exporter a batch when it holds
//! [`BatchOptions::max_batch`] spans or every [`BatchOptions::delay`],
//! each export bounded by [`BatchOptions::export_timeout`].
//! [`Exporting::finish`] exports what is still queued, within a bound, when
//! the server stops.
//!
//! **Why not the SDK's `BatchSpanProcessor`:** it runs a thread of its own
//! and blocks it on each export, and it counts the spans it drops without
//! telling anyone but its shutdown log; its async-runtime variant is
//! experimental. This task is the same idea on the runtime the server
//! already has, with the drop count as a metric and an async, bounded
//! flush at shutdown.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::metrics as m;

/// How spans are batched (the OpenTelemetry SDK's `OTEL_BSP_*` settings,
/// with its defaults).
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Spans queued at most; beyond it they are dropped and counted.
    pub max_queue: usize,
    /// Spans per export at most.
    pub max_batch: usize,
    /// How long a span waits at most before it is exported.
    pub delay: Duration,
    /// How long one export may take before it is given up.
    pub export_timeout: Duration,
}

impl Default for BatchOptions {
    fn default() -> BatchOptions {
        BatchOptions {
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_secs(5),
            export_timeout: Duration::from_secs(30),
        }
    }
}

/// Starts exporting through `exporter` on the current tokio runtime: the
/// tracer to record spans with, and the handle that flushes at shutdown.
/// Must be called within a tokio runtime.
pub fn start<E>(exporter: E, resource: Resource, options: BatchOptions) -> (SdkTracer, Exporting)
where
    E: SpanExporter + 'static,
{
    let max_queue = options.max_queue.max(1);
    let (queue_tx, queue_rx) = mpsc::channel(max_queue);
    // Control messages are rare (the resource once, flush requests, stop).
    let (control_tx, control_rx) = mpsc::channel(8);
    let processor = Batcher {
        queue: queue_tx,
        control: control_tx.clone(),
    };
    // Building the provider hands the processor the resource, which it
    // passes on to the exporter task before any span can be queued.
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("tollgate");
    let task = tokio::spawn(run(exporter, queue_rx, control_rx, options));
    (
        tracer,
        Exporting {
            control: control_tx,
            task,
            _provider: provider,
        },
    )
}

/// The running exporter task.
#[derive(Debug)]
pub struct Exporting {
    control: mpsc::Sender<Control>,
    task: JoinHandle<()>,
    /// Kept so the provider lives as long as the task (the tracer holds it
    /// too).
    _provider: SdkTracerProvider,
}

impl Exporting {
    /// Exports every span still queued and stops the exporter, waiting at
    /// most `within`; whether everything was sent by then. Call it once no
    /// more decisions are made: spans ended later are dropped.
    pub async fn finish(self, within: Duration) -> bool {
        let Exporting { control, task, .. } = self;
        let stopped = async {
            // The task may be gone already (a panic): then so is the queue.
            let _ = control.send(Control::Stop).await;
            task.await.is_ok()
        };
        match tokio::time::timeout(within, stopped).await {
            Ok(done) => done,
            Err(_) => {
                tracing::warn!(
                    ?within,
                    "spans not exported within the shutdown grace period; dropping them"
                );
                false
            }
        }
    }
}

enum Control {
    Resource(Resource),
    Flush,
    Stop,
}

/// The span processor: queues ended spans for the exporter task.
#[derive(Debug)]
struct Batcher {
    queue: mpsc::Sender<SpanData>,
    control: mpsc::Sender<Control>,
}

impl SpanProcessor for Batcher {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // Never waits: a decision must not be slowed by its span.
        if self.queue.try_send(span).is_err() {
            metrics::counter!(m::SPANS_DROPPED).increment(1);
        }
    }

    /// Asks the task to export what it has now, without waiting for it:
    /// this is called from synchronous code that may run on the runtime
    /// the export needs. [`Exporting::finish`] is the flush that waits.
    fn force_flush(&self) -> OTelSdkResult {
        let _ = self.control.try_send(Control::Flush);
        Ok(())
    }

    /// Nothing to do here: the provider shuts its processors down when it
    /// is dropped, from synchronous code; [`Exporting::finish`] stops the
    /// task, asynchronously and within a bound.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        // The channel is new and has room: this is its first message.
        let _ = self.control.try_send(Control::Resource(resource.clone()));
    }
}

/// The exporter task.
async fn run<E: SpanExporter>(
    mut exporter: E,
    mut queue: mpsc::Receiver<SpanData>,
    mut control: mpsc::Receiver<Control>,
    options: BatchOptions,
) {
    let max_batch = options.max_batch.max(1);
    let delay = options.delay.max(Duration::from_millis(1));
    let mut batch = Vec::with_capacity(max_batch);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + delay, delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut export = Export {
        timeout: options.export_timeout,
        failing: false,
    };
    loop {
        tokio::select! {
            // Control first, so the resource reaches the exporter before
            // the first span does.
            biased;
            message = control.recv() => match message {
                Some(Control::Resource(resource)) => exporter.set_resource(&resource),
                Some(Control::Flush) => export.send(&exporter, &mut batch).await,
                Some(Control::Stop) | None => break,
            },
            Some(span) = queue.recv() => {
                batch.push(span);
                if batch.len() >= max_batch {
                    export.send(&exporter, &mut batch).await;
                }
            }
            _ = tick.tick() => export.send(&exporter, &mut batch).await,
        }
    }
    // Stopping: what is queued now is every span of the decisions made.
    queue.close();
    while let Some(span) = queue.recv().await {
        batch.push(span);
        if batch.len() >= max_batch {
            export.send(&exporter, &mut batch).await;
        }
    }
    export.send(&exporter, &mut batch).await;
    if let Err(e) = exporter.shutdown() {
        tracing::debug!(error = %e, "span exporter shutdown");
    }
}

/// One export at a time, logging when exports start and stop failing
/// (not every failure: a collector that is down would flood the log).
struct Export {
    timeout: Duration,
    failing: bool,
}

impl Export {
    async fn send<E: SpanExporter>(&mut self, exporter: &E, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::take(batch);
        let count = spans.len() as u64;
        let result = match tokio::time::timeout(self.timeout, exporter.export(spans)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        };
        match result {
            Ok(()) => {
                metrics::counter!(m::SPANS_EXPORTED, "outcome" => "ok").increment(count);
                if self.failing {
                    tracing::info!("exporting spans again");
                    self.failing = false;
                }
            }
            Err(error) => {
                metrics::counter!(m::SPANS_EXPORTED, "outcome" => "error").increment(count);
                if !self.failing {
                    tracing::warn!(%error, spans = count, "cannot export spans; they are dropped until the collector answers");
                    self.failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{Span as _, Tracer as _};
    use tokio::sync::Semaphore;

    use super::*;

    /// An exporter that keeps what it is sent, and exports only when the
    /// test lets it (one permit per export).
    #[derive(Debug, Clone)]
    struct Gate {
        received: Arc<Mutex<Vec<String>>>,
        open: Arc<Semaphore>,
        resource: Arc<Mutex<Option<Resource>>>,
    }

    impl SpanExporter for Gate {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let permit = self.open.acquire().await;
            permit.expect("never closed").forget();
            let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
            received.extend(batch.into_iter().map(|s| s.name.into_owned()));
            Ok(())
        }

        fn set_resource(&mut self, resource: &Resource) {
            *self.resource.lock().unwrap_or_else(|e| e.into_inner()) = Some(resource.clone());
        }
    }

    fn gate() -> Gate {
        Gate {
            received: Arc::default(),
            open: Arc::new(Semaphore::new(0)),
            resource: Arc::default(),
        }
    }

    fn received(g: &Gate) -> Vec<String> {
        g.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    #[tokio::test]
    async fn a_full_queue_drops_spans_without_waiting_and_finish_flushes_the_rest() {
        let g = gate();
        let resource = Resource::builder_empty().with_service_name("t").build();
        let (tracer, exporting) = start(
            g.clone(),
            resource,
            BatchOptions {
                max_queue: 4,
                max_batch: 100,
                // Never on its own during the test: only finish exports.
                delay: Duration::from_secs(3600),
                export_timeout: Duration::from_secs(60),
            },
        );
        // The task is idle (no batch is full, no tick), so the queue fills:
        // four spans fit, the next six are dropped, and none of the ten
        // calls waits for the exporter.
        for i in 0..10 {
            tracer.start(format!("span-{i}")).end();
        }
        g.open.add_permits(100);
        assert!(exporting.finish(Duration::from_secs(60)).await);
        assert_eq!(received(&g), ["span-0", "span-1", "span-2", "span-3"]);
        let resource = g.resource.lock().unwrap().clone().unwrap();
        assert_eq!(
            resource
                .get(&opentelemetry::Key::new("service.name"))
                .map(|v| v.to_string()),
            Some("t".to_owned())
        );
    }

    #[tokio::test]
    async fn a_full_batch_is_exported_without_waiting_for_the_delay() {
        let g = gate();
        g.open.add_permits(100);
        let (tracer, exporting) = start(
            g.clone(),
            Resource::builder_empty().build(),
            BatchOptions {
                max_queue: 100,
                max_batch: 3,
                delay: Duration::from_secs(3600),
                export_timeout: Duration::from_secs(60),
            },
        );
        for i in 0..3 {
            tracer.start(format!("span-{i}")).end();
        }
        // Polled with a generous bound: the export happens on the task.
        for _ in 0..6000 {
            if received(&g).len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(received(&g), ["span-0", "span-1", "span-2"]);
        assert!(exporting.finish(Duration::from_secs(60)).await);
    }

    // Paused time: the 50 ms bound passes as soon as the runtime is idle.
    #[tokio::test(start_paused = true)]
    async fn finish_gives_up_on_an_exporter_that_never_answers() {
        let g = gate();
        let (tracer, exporting) = start(
            g.clone(),
            Resource::builder_empty().build(),
            BatchOptions::default(),
        );
        tracer.start("stuck").end();
        // No permits: the export waits forever; finish must not.
        assert!(!exporting.finish(Duration::from_millis(50)).await);
    }
}
