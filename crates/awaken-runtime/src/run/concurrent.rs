//! A step's tool calls run concurrently (the agent's `parallel_tools`), in lanes: calls whose
//! declared writes overlap share one and run in call order.

use std::collections::HashMap;

use awaken_event::ToolCall;
use awaken_resolver::ResolvedTool;

use crate::run::calls::{CallOutcome, Prepared};
use crate::run::invoke::Ran;
use crate::run::{Failure, Run};

impl Run<'_> {
    /// The calls of a step concurrently (the agent's `parallel_tools`): each is prepared
    /// (checked, gated, `BeforeToolExecute`) in call order, the allowed ones are committed
    /// `Executing` together and run at once on the run's task, except that calls whose tools
    /// declare overlapping `writes()` run one after another in call order (each seeing the
    /// state the previous one left). Their commands are merged by the state merge rules as
    /// each finishes; then `AfterToolExecute` and the results follow in call order, so the
    /// committed history is the one a sequential run gives.
    pub(super) async fn run_calls_concurrently(
        &mut self,
        calls: &[ToolCall],
    ) -> Result<bool, Failure> {
        let mut prepared: Vec<Option<CallOutcome>> = Vec::with_capacity(calls.len());
        // (The call's index, its tool's place in the resolved tools.)
        let mut to_run: Vec<(usize, usize)> = Vec::new();
        // (The call's index, the call in its tool's canonical form) for the calls whose
        // arguments were not in it (none for most steps: nothing is allocated then).
        let mut normalized: Vec<(usize, Box<ToolCall>)> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            self.begin_call(calls, i).await?;
            match self.prepare_call(call, None).await {
                Ok(Prepared::Done(outcome)) => prepared.push(Some(outcome)),
                Ok(Prepared::Run(at, canonical)) => {
                    prepared.push(None);
                    to_run.push((i, at));
                    if let Some(canonical) = canonical {
                        normalized.push((i, canonical));
                    }
                }
                Err(failure) => {
                    self.close_all(calls, failure.call_reason()).await?;
                    return Err(failure);
                }
            }
        }
        let started: Vec<&ToolCall> = to_run.iter().map(|(i, _)| &calls[*i]).collect();
        self.mark_executing(&started).await?;
        // The call as the gates saw it: the tool and `AfterToolExecute` see the same.
        let call_at = |i: usize| {
            normalized
                .iter()
                .find(|(n, _)| *n == i)
                .map_or(&calls[i], |(_, c)| &**c)
        };
        // Lanes: calls whose declared writes overlap (transitively) share a lane and run in
        // call order; lanes run concurrently.
        let tools = &self.resolved.tools;
        let lanes = write_lanes(&to_run, tools);
        let invocation = self.invocation();
        let engine = &self.engine;
        let ran: Vec<Vec<(usize, Ran)>> =
            futures_util::future::join_all(lanes.into_iter().map(|lane| {
                let invocation = &invocation;
                let to_run = &to_run;
                let call_at = &call_at;
                async move {
                    let mut out = Vec::with_capacity(lane.len());
                    for slot in lane {
                        let (i, at) = to_run[slot];
                        out.push((
                            i,
                            invocation
                                .run(&tools[at], call_at(i), None, engine, true)
                                .await,
                        ));
                    }
                    out
                }
            }))
            .await;
        let mut results: Vec<Option<Ran>> = (0..calls.len()).map(|_| None).collect();
        for (i, r) in ran.into_iter().flatten() {
            results[i] = Some(r);
        }
        let mut suspended = false;
        for (i, call) in calls.iter().enumerate() {
            let outcome = match (prepared[i].take(), results[i].take()) {
                (Some(outcome), _) => outcome,
                (None, Some(ran)) => match self.after_tool(call_at(i), ran, None).await {
                    Ok(o) => o,
                    Err(failure) => {
                        // The later calls ran too: those that finished close with their
                        // results (without `AfterToolExecute`: the run is ending).
                        for (later, ran) in results.iter_mut().enumerate().skip(i + 1) {
                            let mut ran = ran.take();
                            while let Some(Ran::EffectsFailed(failed)) = ran {
                                let (inner, failures) = *failed;
                                self.effects_failed(&failures)?;
                                ran = Some(inner);
                            }
                            if let Some((result, state)) = ran.and_then(Ran::finished) {
                                self.close(&calls[later], result, state).await?;
                            }
                        }
                        self.close_all(&calls[i..], failure.call_reason()).await?;
                        return Err(failure);
                    }
                },
                (None, None) => {
                    return Err(Failure::Error(format!(
                        "tool call {} was neither prepared nor run",
                        call.id
                    )));
                }
            };
            suspended |= self.settle(call, outcome, i + 1 == calls.len()).await?;
        }
        self.check_cancelled()?;
        Ok(suspended)
    }
}

/// Groups the calls to run into lanes: calls whose tools' declared `writes()` overlap, even
/// through a third call, share a lane (in call order); a call that declares none has its own.
fn write_lanes(to_run: &[(usize, usize)], tools: &[ResolvedTool]) -> Vec<Vec<usize>> {
    let mut lane_of: Vec<usize> = (0..to_run.len()).collect();
    fn root(lane_of: &mut [usize], mut i: usize) -> usize {
        while lane_of[i] != i {
            lane_of[i] = lane_of[lane_of[i]];
            i = lane_of[i];
        }
        i
    }
    for a in 0..to_run.len() {
        for b in (a + 1)..to_run.len() {
            let wa = tools[to_run[a].1].tool.writes();
            let wb = tools[to_run[b].1].tool.writes();
            if wa.iter().any(|k| wb.contains(k)) {
                let (ra, rb) = (root(&mut lane_of, a), root(&mut lane_of, b));
                if ra != rb {
                    lane_of[ra.max(rb)] = ra.min(rb);
                }
            }
        }
    }
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<usize, usize> = HashMap::new();
    for slot in 0..to_run.len() {
        let r = root(&mut lane_of, slot);
        let lane = *index.entry(r).or_insert_with(|| {
            lanes.push(Vec::new());
            lanes.len() - 1
        });
        lanes[lane].push(slot);
    }
    lanes
}
