// What the kernel and the front ends say to each other: each widget's synced
// traits, the dict its `state` trait holds, and the custom messages both ways
// (tagged by `type`). The twin of launchhelm/widgets/_messages.py, whose
// TypedDicts are the reference: tests/widgets/test_widget_messages.py checks
// that each typedef here names the same keys as its TypedDict there.

/** The message types, spelled once on this side. */
export const MSG = /** @type {const} */ ({
  /** front end -> kernel: it listens now (after each embed) */
  READY: "ready",
  /** front end -> kernel: a button ({name, args}: ActionArgs) */
  ACTION: "action",
  /** front end -> kernel: the chart's zoomed step range, or null for all of it */
  ZOOM: "zoom",
  /** kernel -> front end: hide the saved pictures of these models */
  LIVE: "live",
  /** kernel -> front end: replace the chart's datasets */
  SNAPSHOT: "snapshot",
  /** kernel -> front end: append rows to the chart's points */
  INSERT: "insert",
  /** kernel -> front end: the Logs tab's whole text */
  RESET: "reset",
  /** kernel -> front end: what the run printed since */
  APPEND: "append",
  /** front end -> kernel: the Media tab (or CompareChart's media section) wants pictures, a table or the histograms */
  FETCH: "fetch",
  /** kernel -> front end: pictures (thumbnails or one full image), their bytes in the buffers */
  PICTURES: "pictures",
  /** kernel -> front end: one table's cells, its image cells' thumbnails in the buffers */
  TABLE: "table",
  /** kernel -> front end: the histograms over steps, as one Vega-Lite spec */
  HISTOGRAMS: "histograms",
});

/** A value as JSON carries it (config and tunable values, diff cells). */
/** @typedef {null | boolean | number | string | Json[] | { [key: string]: Json }} Json */
/** A Vega-Lite spec, built by the kernel. */
/** @typedef {Record<string, any>} VegaLiteSpec */

/**
 * @typedef {object} RunName
 * @property {string} id
 * @property {string} name
 */

/**
 * @typedef {object} RunRef
 * @property {string} id
 * @property {string} name
 * @property {string} project
 */

/**
 * Every live widget's: a sentence about the last failure ("" when fine).
 * @typedef {object} LiveTraits
 * @property {string} error
 */

/**
 * @typedef {object} PickerCheckpoint
 * @property {string} id
 * @property {number} step
 * @property {string} saved_at
 * @property {string} size
 * @property {number} shards
 * @property {string} layout
 * @property {number} steps_to_redo
 * @property {boolean} before_last_control_change
 * @property {boolean} latest
 * @property {boolean} chosen
 */

/**
 * @typedef {object} PickerState
 * @property {RunRef} run
 * @property {string} status
 * @property {string[]} attempts
 * @property {string} restart_loop
 * @property {string} sentence
 * @property {number} step
 * @property {Record<string, number>} times
 * @property {boolean} can_choose
 * @property {string} restores
 * @property {string} confirmation
 * @property {string} earlier
 * @property {PickerCheckpoint[]} checkpoints
 */

/**
 * @typedef {object} PickerTraits
 * @property {string} error
 * @property {PickerState} state
 */

/**
 * @typedef {object} DetailsPending
 * @property {number} seq
 * @property {string} what
 * @property {string} time
 */

/**
 * @typedef {object} DetailsState
 * @property {RunRef} run
 * @property {string} status
 * @property {string} sentence
 * @property {number} step
 * @property {string} created
 * @property {string} last_heartbeat
 * @property {number} created_ts
 * @property {number | null} last_heartbeat_ts
 * @property {Record<string, number>} times
 * @property {number} sessions
 * @property {number} rewinds
 * @property {string[]} attempts
 * @property {string | null} control_state
 * @property {Record<string, Json>} config
 * @property {Record<string, Json>} tunables
 * @property {DetailsPending[]} pending
 * @property {boolean} can_control
 * @property {boolean} can_tune
 * @property {string[]} actions
 * @property {boolean} rule
 * @property {string} notice
 */

/**
 * @typedef {object} DetailsTraits
 * @property {string} error
 * @property {string} view
 * @property {DetailsState} state
 */

/**
 * @typedef {object} LogsState
 * @property {string} status
 * @property {boolean} empty
 * @property {number} max_lines
 */

/**
 * @typedef {object} LogsTraits
 * @property {string} error
 * @property {string} view
 * @property {LogsState} state
 */

/**
 * @typedef {object} ResetMessage
 * @property {"reset"} type
 * @property {string} text
 */

/**
 * @typedef {object} AppendMessage
 * @property {"append"} type
 * @property {string} text
 */

/**
 * @typedef {object} EvaluationRow
 * @property {string} run_id
 * @property {string} run_name
 * @property {string} checkpoint
 * @property {number} step
 * @property {string} state
 * @property {string} detail
 * @property {Record<string, number>} times
 * @property {number | null} took
 * @property {number} attempts
 * @property {string | null} evaluation_id
 * @property {boolean} can_retry
 * @property {boolean} can_evaluate
 */

/**
 * @typedef {object} EvaluationsState
 * @property {"run" | "project"} scope
 * @property {string} project
 * @property {RunName | null} run
 * @property {boolean} rule
 * @property {EvaluationRow[]} rows
 * @property {string} notice
 */

/**
 * @typedef {object} EvaluationsTraits
 * @property {string} error
 * @property {EvaluationsState} state
 */

/**
 * Rows as columns: `k` indexes `keys`; `time` (ms) only when a wall-time panel is drawn.
 * @typedef {object} ChartColumns
 * @property {string[]} keys
 * @property {number[]} k
 * @property {number[]} step
 * @property {number[]} value
 * @property {number[]} attempt
 * @property {boolean[]} abandoned
 * @property {number[]} [time]
 */

/**
 * @typedef {object} ChartRewind
 * @property {number} to_step
 * @property {number} reached
 * @property {number} attempt
 * @property {string} checkpoint
 * @property {string} label
 */

/**
 * @typedef {object} ChartSnapshot
 * @property {"snapshot"} type
 * @property {ChartColumns} points
 * @property {ChartRewind[]} rewinds
 * @property {number[] | null} domain
 */

/**
 * @typedef {object} ChartInsert
 * @property {"insert"} type
 * @property {ChartColumns} points
 */

/**
 * @typedef {object} ChartTraits
 * @property {string} error
 * @property {VegaLiteSpec} spec
 * @property {boolean} show_abandoned
 * @property {string} caption
 * @property {number} last_point
 */

/**
 * A compared run in the legend: `label` is its name (with its id where two share one).
 * @typedef {object} ShownRun
 * @property {string} id
 * @property {string} label
 * @property {string} color
 * @property {string} name
 */

/**
 * @typedef {object} CompareRun
 * @property {string} id
 * @property {string} label
 * @property {string} color
 * @property {string} name
 * @property {string} status
 * @property {number | null} step
 * @property {number | null} created
 * @property {number | null} last_heartbeat
 * @property {number | null} rewinds
 */

/**
 * @typedef {object} CompareDiff
 * @property {string} key
 * @property {Json[]} values
 */

/**
 * @typedef {object} CompareState
 * @property {string} project
 * @property {CompareRun[]} runs
 * @property {CompareDiff[]} diff
 */

/**
 * Rows as columns: `r` indexes `labels` (runs), `k` indexes `keys`; `time` in ms.
 * @typedef {object} CompareColumns
 * @property {string[]} labels
 * @property {string[]} keys
 * @property {number[]} r
 * @property {number[]} k
 * @property {number[]} step
 * @property {number[]} time
 * @property {number[]} elapsed
 * @property {number[]} value
 * @property {number[]} raw
 */

/**
 * @typedef {object} CompareRewind
 * @property {string} run_id
 * @property {number} to_step
 * @property {number} reached
 * @property {number} attempt
 * @property {number | null} time
 * @property {number | null} elapsed
 * @property {string} text
 * @property {string} label
 */

/**
 * @typedef {object} CompareSnapshot
 * @property {"snapshot"} type
 * @property {CompareColumns} points
 * @property {CompareRewind[]} rewinds
 */

/**
 * @typedef {object} CompareTraits
 * @property {string} error
 * @property {VegaLiteSpec} spec
 * @property {CompareState} state
 * @property {string} x_axis
 * @property {boolean} smooth
 * @property {number} smoothing
 * @property {CompareMediaState} media
 * @property {string} media_key
 * @property {number} media_step
 */

/**
 * @typedef {object} TableColumn
 * @property {string} id
 * @property {string} label
 * @property {string} kind
 */

/**
 * @typedef {object} TableRow
 * @property {string} id
 * @property {string} name
 * @property {string} status
 * @property {string} sentence
 * @property {string} detail
 * @property {number | null} step
 * @property {number | null} created
 * @property {number | null} last_heartbeat
 * @property {number | null} duration
 * @property {number | null} sessions
 * @property {number | null} rewinds
 * @property {number | null} restarts
 * @property {Record<string, Json>} values
 */

/**
 * @typedef {object} RunsTableState
 * @property {string} project
 * @property {string} store
 * @property {TableColumn[]} columns
 * @property {TableRow[]} rows
 * @property {number} now
 * @property {boolean} picker
 */

/**
 * @typedef {object} RunsTableTraits
 * @property {string} error
 * @property {RunsTableState} state
 * @property {string} sort_by
 * @property {boolean} descending
 * @property {string} query
 * @property {string[]} statuses
 * @property {string[]} hidden
 * @property {string[]} selected
 */

/**
 * A key the Media tab shows: its kind and every step it was logged at.
 * @typedef {object} MediaKey
 * @property {string} key
 * @property {string} kind
 * @property {number[]} steps
 * @property {number[]} rewound
 */

/**
 * @typedef {object} MediaState
 * @property {RunRef} run
 * @property {string} status
 * @property {MediaKey[]} keys
 * @property {number[]} steps
 * @property {string} empty
 */

/**
 * @typedef {object} MediaTraits
 * @property {string} error
 * @property {MediaState} state
 * @property {number} step
 */

/**
 * One image: where it was logged and which buffer of the message holds its bytes.
 * @typedef {object} MediaPicture
 * @property {string} key
 * @property {number} step
 * @property {number} attempt
 * @property {boolean} abandoned
 * @property {number} index
 * @property {string} caption
 * @property {number} width
 * @property {number} height
 * @property {string} mime
 * @property {number} buffer
 */

/**
 * @typedef {object} PicturesMessage
 * @property {"pictures"} type
 * @property {number} step
 * @property {boolean} full
 * @property {string[]} keys
 * @property {MediaPicture[]} pictures
 */

/**
 * An image cell of a table: its thumbnail in buffer `buffer` (a plain cell is a JSON value).
 * @typedef {object} TableImageCell
 * @property {number} buffer
 * @property {string} mime
 * @property {string} caption
 */

/**
 * @typedef {object} TableMessage
 * @property {"table"} type
 * @property {string} key
 * @property {number} asked
 * @property {number} step
 * @property {number} attempt
 * @property {boolean} abandoned
 * @property {string} caption
 * @property {string[]} columns
 * @property {(Json | TableImageCell)[][]} rows
 */

/**
 * @typedef {object} HistogramsMessage
 * @property {"histograms"} type
 * @property {VegaLiteSpec} spec
 * @property {Record<string, number[]>} shown
 */

/**
 * Front end -> kernel: `what` is "thumbnails", "image", "table" or "histograms".
 * @typedef {object} FetchMessage
 * @property {"fetch"} type
 * @property {string} what
 * @property {number} step
 * @property {string[]} keys
 * @property {number} attempt
 * @property {number} index
 * @property {string} [run]
 */

/**
 * An image key any compared run logged: every step one of them logged it at, and which runs did.
 * @typedef {object} CompareMediaKey
 * @property {string} key
 * @property {number[]} steps
 * @property {string[]} runs
 */

/**
 * @typedef {object} CompareMediaState
 * @property {CompareMediaKey[]} keys
 */

/**
 * One run's pictures of the key at the step (its newest attempt's), in the chart's run order.
 * @typedef {object} CompareRunPictures
 * @property {string} id
 * @property {string} label
 * @property {string} color
 * @property {string} empty
 * @property {boolean} redone
 * @property {MediaPicture[]} pictures
 */

/**
 * @typedef {object} ComparePicturesMessage
 * @property {"pictures"} type
 * @property {string} key
 * @property {number} step
 * @property {boolean} full
 * @property {CompareRunPictures[]} runs
 */

/**
 * @typedef {object} LiveMessage
 * @property {"live"} type
 * @property {string[]} static
 */

/**
 * @typedef {object} ReadyMessage
 * @property {"ready"} type
 */

/**
 * @typedef {object} ZoomMessage
 * @property {"zoom"} type
 * @property {number[] | null} domain
 */

/**
 * @typedef {object} ChooseArgs
 * @property {string} checkpoint_id
 */

/**
 * @typedef {object} RetryArgs
 * @property {string} evaluation_id
 */

/**
 * @typedef {object} EvaluateArgs
 * @property {string} checkpoint_id
 * @property {string | null} [run_id]
 */

/**
 * @typedef {object} SetRuleArgs
 * @property {boolean} enabled
 */

/**
 * @typedef {object} SetTunablesArgs
 * @property {Record<string, Json>} values
 */

/**
 * @typedef {object} ControlArgs
 * @property {string} action
 */

/**
 * Each button's arguments, by action name (the widgets' `_actions`).
 * @typedef {object} ActionArgs
 * @property {ChooseArgs} choose
 * @property {RetryArgs} retry
 * @property {EvaluateArgs} evaluate
 * @property {SetRuleArgs} set_rule
 * @property {SetTunablesArgs} set_tunables
 * @property {ControlArgs} control
 */

/**
 * @typedef {object} ActionMessage
 * @property {"action"} type
 * @property {string} name
 * @property {Record<string, Json>} args
 */

/** What a front end sends. */
/** @typedef {ReadyMessage | ActionMessage | ZoomMessage | FetchMessage} ToKernel */
/** What the kernel sends each front end. */
/** @typedef {LiveMessage | ChartSnapshot | ChartInsert} ToChart */
/** @typedef {LiveMessage | CompareSnapshot | ComparePicturesMessage} ToCompare */
/** @typedef {LiveMessage | ResetMessage | AppendMessage} ToLogs */
/** @typedef {LiveMessage | PicturesMessage | TableMessage | HistogramsMessage} ToMedia */
