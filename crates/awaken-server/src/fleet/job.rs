//! What a queued job carries: the activation a front end asked for, in the form workers read.

use awaken_event::{CancellationToken, Message, ProfileId, RunId, ThreadId, ToolCallResume};
use awaken_runtime::{Resume, RunActivation};
use awaken_spec::InferenceOverride;
use serde::{Deserialize, Serialize};

/// The payload of a queued job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum JobPayload {
    /// A new run with new messages.
    Run {
        messages: Vec<Message>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<ProfileId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inference: Option<InferenceOverride>,
        #[serde(default)]
        supersede: bool,
    },
    /// Decisions for the waiting run.
    Resume { decisions: Vec<ToolCallResume> },
}

impl JobPayload {
    /// The payload of a new run's activation.
    pub(crate) fn of_run(activation: &RunActivation) -> Self {
        JobPayload::Run {
            messages: activation.messages.clone(),
            profile: activation.profile_id.clone(),
            inference: activation.inference.clone(),
            supersede: activation.supersede,
        }
    }

    /// The payload of a resume.
    pub(crate) fn of_resume(resume: &Resume) -> Self {
        JobPayload::Resume {
            decisions: resume.decisions.clone(),
        }
    }
}

/// A job's activation, ready to drive.
pub(crate) enum Activation {
    Run(RunActivation),
    Resume(Resume),
}

impl JobPayload {
    /// The activation this payload asks for on `thread_id`, as run `run_id` of `agent_id`,
    /// cancelled by `cancel`.
    pub(crate) fn activation(
        self,
        thread_id: ThreadId,
        run_id: RunId,
        agent_id: &str,
        cancel: CancellationToken,
    ) -> Activation {
        match self {
            JobPayload::Run {
                messages,
                profile,
                inference,
                supersede,
            } => {
                let mut activation = RunActivation::new(thread_id, agent_id).with_run_id(run_id);
                for message in messages {
                    activation = activation.with_message(message);
                }
                if let Some(profile) = profile {
                    activation = activation.with_profile(profile);
                }
                if let Some(inference) = inference {
                    activation = activation.with_inference(inference);
                }
                if supersede {
                    activation = activation.with_supersede();
                }
                activation.cancel = cancel;
                Activation::Run(activation)
            }
            JobPayload::Resume { decisions } => {
                let mut resume = Resume::new(thread_id);
                resume.decisions = decisions;
                resume.cancel = cancel;
                Activation::Resume(resume)
            }
        }
    }
}
