//! Reading a segment back.

use super::*;

/// A cursor over a segment written above.
pub(crate) struct Reader<'a> {
    /// The whole segment (back-references point into it).
    segment: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Where this reader stops (the end of the segment or of its part being read).
    end: usize,
    /// Where the messages part starts, when this reader reads it (its references name a
    /// part: see [`Writer`](super::write::Writer)).
    messages_at: Option<usize>,
}

impl<'a> Reader<'a> {
    /// A reader of the whole of `segment`.
    pub(crate) fn new(segment: &'a [u8]) -> Self {
        Self::part(segment, 0..segment.len())
    }

    /// A reader of `part` of `segment` (clamped to it).
    pub(crate) fn part(segment: &'a [u8], part: std::ops::Range<usize>) -> Self {
        let end = part.end.min(segment.len());
        Self {
            segment,
            pos: part.start.min(end),
            end,
            messages_at: None,
        }
    }

    /// A reader of the messages part of `segment`, which starts at `messages_at` (the events
    /// part before it).
    pub(crate) fn messages(segment: &'a [u8], messages_at: usize) -> Self {
        let mut reader = Self::part(segment, messages_at..segment.len());
        reader.messages_at = Some(reader.pos);
        reader
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn left(&self) -> usize {
        self.end - self.pos
    }

    fn u8(&mut self) -> Read<u8> {
        if self.is_empty() {
            return Err(Malformed::new("ends early"));
        }
        let b = self.segment[self.pos];
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn u64(&mut self) -> Read<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(Malformed::new("a number longer than 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed::new("a number longer than 64 bits"))
    }

    fn i64(&mut self) -> Read<i64> {
        let v = self.u64()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn u32(&mut self) -> Read<u32> {
        u32::try_from(self.u64()?).map_err(|_| Malformed::new("a number above u32"))
    }

    /// A count or length: never more than the bytes left (every item takes at least one).
    fn bounded(&self, n: u64) -> Read<usize> {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.left())
            .ok_or_else(|| Malformed::new(format!("a count of {n} with fewer bytes left")))
    }

    pub(crate) fn len(&mut self) -> Read<usize> {
        let n = self.u64()?;
        self.bounded(n)
    }

    fn bytes(&mut self, n: usize) -> Read<&'a [u8]> {
        if n > self.left() {
            return Err(Malformed::new("ends early"));
        }
        let head = &self.segment[self.pos..self.pos + n];
        self.pos += n;
        Ok(head)
    }

    /// A string: a literal, or a back-reference to an earlier literal of the segment.
    pub(crate) fn str(&mut self) -> Read<&'a str> {
        let at = self.pos;
        let head = self.u64()?;
        let bytes = if head & 1 == 0 {
            let n = self.bounded(head >> 1)?;
            self.bytes(n)?
        } else {
            // The literal must start before the reference (never at or after it: no loop).
            let target = match self.messages_at {
                None => usize::try_from(head >> 1).ok(),
                // In the messages part: the literal's part, then its place in it.
                Some(messages_at) => usize::try_from(head >> 2).ok().and_then(|t| {
                    if head >> 1 & 1 == 1 {
                        t.checked_add(messages_at)
                    } else {
                        Some(t)
                    }
                }),
            };
            let target = target
                .filter(|&t| t < at)
                .ok_or_else(|| Malformed::new("a string reference that is not backwards"))?;
            let mut literal = Reader::part(self.segment, target..at);
            let literal_head = literal.u64()?;
            if literal_head & 1 != 0 {
                return Err(Malformed::new("a string reference to a reference"));
            }
            let n = literal.bounded(literal_head >> 1)?;
            literal.bytes(n)?
        };
        std::str::from_utf8(bytes).map_err(|e| Malformed::new(e.to_string()))
    }

    fn opt_str(&mut self) -> Read<Option<&'a str>> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            tag => Err(Malformed::new(format!("option tag {tag}"))),
        }
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self) -> Read<T> {
        serde_json::from_str(self.str()?).map_err(|e| Malformed::new(e.to_string()))
    }

    pub(super) fn value(&mut self) -> Read<Value> {
        self.value_at(0)
    }

    fn value_at(&mut self, depth: usize) -> Read<Value> {
        if depth >= MAX_DEPTH {
            return Err(Malformed::new(format!(
                "a JSON value nested over {MAX_DEPTH} deep"
            )));
        }
        Ok(match self.u8()? {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            UNSIGNED => Value::Number(Number::from(self.u64()?)),
            NEGATIVE => Value::Number(Number::from(!self.u64()? as i64)),
            FLOAT => {
                let raw = self.bytes(8)?;
                let mut b = [0u8; 8];
                b.copy_from_slice(raw);
                let f = f64::from_le_bytes(b);
                Value::Number(Number::from_f64(f).ok_or_else(|| Malformed::new("a NaN"))?)
            }
            STRING => Value::String(self.str()?.to_owned()),
            ARRAY => Value::Array(self.items(|r| r.value_at(depth + 1))?),
            OBJECT => {
                let n = self.len()?;
                let mut map = Map::new();
                for _ in 0..n {
                    let k = self.str()?.to_owned();
                    map.insert(k, self.value_at(depth + 1)?);
                }
                Value::Object(map)
            }
            tag => return Err(Malformed::new(format!("value tag {tag}"))),
        })
    }

    fn usage(&mut self) -> Read<TokenUsage> {
        let present = self.u8()?;
        if present > 0b1111 {
            return Err(Malformed::new(format!("token counts tag {present}")));
        }
        let mut counts = [0u64; 4];
        for (i, n) in counts.iter_mut().enumerate() {
            if present & 1 << i != 0 {
                *n = self.u64()?;
            }
        }
        let [
            input_tokens,
            output_tokens,
            cached_input_tokens,
            reasoning_tokens,
        ] = counts;
        Ok(TokenUsage {
            input_tokens,
            output_tokens,
            cached_input_tokens,
            reasoning_tokens,
        })
    }

    /// An id of any kind (parsed as its type parses it).
    pub(crate) fn id<T: FromStr<Err = IdError>>(&mut self) -> Read<T> {
        self.str()?
            .parse()
            .map_err(|e: IdError| Malformed::new(e.to_string()))
    }

    fn opt_id<T: FromStr<Err = IdError>>(&mut self) -> Read<Option<T>> {
        self.opt_str()?
            .map(|id| {
                id.parse()
                    .map_err(|e: IdError| Malformed::new(e.to_string()))
            })
            .transpose()
    }

    /// A finished run's row as [`Writer::run_row`](super::write::Writer::run_row) wrote it, the
    /// row of `run_id`: its thread, its record (`Done`), its state's revision and its lease
    /// epoch.
    pub(crate) fn run_row(
        &mut self,
        run_id: &RunId,
        digest_at: impl Fn(u32) -> Option<Arc<str>>,
    ) -> Read<(ThreadId, RunRecord, u64, u64)> {
        let thread_id = self.id()?;
        let parent_run_id = self.opt_id()?;
        let agent_id = Arc::from(self.str()?);
        let profile_id = self.opt_id()?;
        let termination = match self.u8()? {
            0 => None,
            1 => Some(TerminationReason::NaturalEnd),
            2 => Some(self.json()?),
            tag => return Err(Malformed::new(format!("termination tag {tag}"))),
        };
        let (steps, usage, spec_digest) = (self.u32()?, self.usage()?, self.digest(digest_at)?);
        let created = self.i64()?;
        let record = RunRecord {
            run_id: run_id.clone(),
            parent_run_id,
            agent_id,
            profile_id,
            status: RunStatus::Done,
            termination,
            steps,
            usage,
            spec_digest,
            created_at: Timestamp::from_unix_millis(created),
            updated_at: Timestamp::from_unix_millis(created.wrapping_add(self.i64()?)),
        };
        Ok((thread_id, record, self.u64()?, self.u64()?))
    }

    /// A spec digest as [`Writer::digest`](super::write::Writer::digest) wrote it.
    fn digest(&mut self, digest_at: impl Fn(u32) -> Option<Arc<str>>) -> Read<Arc<str>> {
        match self.u8()? {
            DIGEST_KEPT => {
                let at = self.u32()?;
                digest_at(at).ok_or_else(|| Malformed::new(format!("no spec digest at {at}")))
            }
            DIGEST_TEXT => Ok(Arc::from(self.str()?)),
            DIGEST_SHA256 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut text = String::with_capacity(SHA256_PREFIX.len() + 64);
                text.push_str(SHA256_PREFIX);
                for b in self.bytes(32)? {
                    text.push(char::from(HEX[usize::from(b >> 4)]));
                    text.push(char::from(HEX[usize::from(b & 0xf)]));
                }
                Ok(Arc::from(text))
            }
            tag => Err(Malformed::new(format!("digest tag {tag}"))),
        }
    }

    /// The next entry of a run's state: its key's name and its value's JSON text.
    pub(crate) fn state_entry(&mut self) -> Read<(&'a str, &'a str)> {
        Ok((self.str()?, self.str()?))
    }

    /// A count, then that many items read by `item`.
    fn items<T>(&mut self, mut item: impl FnMut(&mut Self) -> Read<T>) -> Read<Vec<T>> {
        let n = self.len()?;
        let mut items = Vec::with_capacity(n.min(MAX_RESERVED));
        for _ in 0..n {
            items.push(item(self)?);
        }
        Ok(items)
    }

    /// The next message.
    pub(crate) fn message(&mut self) -> Read<Message> {
        let role = variant(&ROLES, self.u8()?, "role")?;
        let content = self.items(|r| {
            Ok(match r.u8()? {
                BLOCK_TEXT => ContentBlock::Text {
                    text: r.str()?.to_owned(),
                },
                BLOCK_REASONING => ContentBlock::Reasoning {
                    text: r.str()?.to_owned(),
                },
                BLOCK_IMAGE => ContentBlock::Image {
                    url: r.str()?.to_owned(),
                    media_type: r.opt_str()?.map(str::to_owned),
                },
                BLOCK_JSON => ContentBlock::Json {
                    value: Arc::new(r.value()?),
                },
                AS_JSON => r.json()?,
                tag => return Err(Malformed::new(format!("content block tag {tag}"))),
            })
        })?;
        let tool_calls = self.items(|r| {
            Ok(ToolCall {
                id: r.id()?,
                name: r.str()?.to_owned(),
                arguments: Arc::new(r.value()?),
                invalid_arguments: r.opt_str()?.map(str::to_owned),
            })
        })?;
        let tool_call_id = self.opt_id()?;
        Ok(Message {
            role,
            // The thread's own empty lists for none (see `no_content`).
            content: if content.is_empty() {
                no_content()
            } else {
                content.into()
            },
            tool_calls: if tool_calls.is_empty() {
                no_tool_calls()
            } else {
                tool_calls.into()
            },
            tool_call_id,
        })
    }

    /// The next event.
    /// The next event of an events part and its run: the run markers before it (see
    /// [`Writer::run_marker`](super::write::Writer::run_marker)) set `run`.
    pub(crate) fn run_event(&mut self, run: &mut Option<RunId>) -> Read<(RunId, AgentEvent)> {
        while self.segment.get(self.pos) == Some(&RUN_MARKER) && !self.is_empty() {
            self.pos += 1;
            *run = Some(self.id()?);
        }
        let run_id = run
            .clone()
            .ok_or_else(|| Malformed::new("an event before any run marker"))?;
        Ok((run_id, self.event()?))
    }

    pub(crate) fn event(&mut self) -> Read<AgentEvent> {
        Ok(match self.u8()? {
            RUN_START => AgentEvent::RunStart {
                thread_id: self.id()?,
                run_id: self.id()?,
                agent_id: Arc::from(self.str()?),
                parent_run_id: self.opt_id()?,
                resumed: self.u8()? != 0,
            },
            RUN_FINISH => AgentEvent::RunFinish {
                thread_id: self.id()?,
                run_id: self.id()?,
                termination: Box::new(match self.u8()? {
                    0 => TerminationReason::NaturalEnd,
                    1 => self.json()?,
                    tag => return Err(Malformed::new(format!("termination tag {tag}"))),
                }),
                response: self.opt_str()?.map(str::to_owned),
                usage: Box::new(self.usage()?),
            },
            STEP_START => AgentEvent::StepStart { step: self.u32()? },
            STEP_END => AgentEvent::StepEnd { step: self.u32()? },
            TOOL_CALL_START => AgentEvent::ToolCallStart {
                call_id: self.id()?,
                name: Arc::from(self.str()?),
            },
            TOOL_CALL_READY => AgentEvent::ToolCallReady {
                call_id: self.id()?,
                name: Arc::from(self.str()?),
                arguments: Arc::new(self.value()?),
            },
            TOOL_CALL_DONE => {
                let call_id = self.id()?;
                let status = variant(&STATUSES, self.u8()?, "result status")?;
                let content = Arc::new(self.value()?);
                let state = variant(&ToolCallState::ALL, self.u8()?, "tool call state")?;
                AgentEvent::ToolCallDone {
                    call_id,
                    result: Arc::new(ToolResult { status, content }),
                    state,
                }
            }
            INFERENCE_COMPLETE => AgentEvent::InferenceComplete {
                model: Arc::from(self.str()?),
                usage: self.usage()?,
                duration_ms: self.u64()?,
                stop_reason: variant(&StopReason::ALL, self.u8()?, "stop reason")?,
            },
            AS_JSON => self.json()?,
            tag => return Err(Malformed::new(format!("event tag {tag}"))),
        })
    }
}
