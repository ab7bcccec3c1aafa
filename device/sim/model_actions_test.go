// The actions of the device model's state machine (TestDeviceModel):
// each calls the device and the model alike and compares what they
// answer.

package sim

import (
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// actions returns the state machine's actions by name.
func (m *model) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"Malloc":  m.malloc,
		"Free":    m.free,
		"Map":     m.mapPages,
		"Unmap":   m.unmapPages,
		"Reserve": m.reserve,
		"Release": m.release,
		"MemInfo": func(t *rapid.T) {
			free, total, err := m.d.MemInfo()
			require.NoError(t, err)
			m.c.MemInfos++
			m.pay(m.costs.MemInfo)
			require.Equal(t, m.capacity, total)
			require.Equal(t, m.capacity-m.used, free)
		},
		"NewStream": func(t *rapid.T) {
			if len(m.streams) >= 6 {
				t.Skip("enough streams")
			}
			s, err := m.d.NewStream()
			require.NoError(t, err)
			require.Equal(t, handle(m.ordinal, len(m.streams)), s)
			m.streams = append(m.streams, modelStream{})
			m.c.StreamsCreated++
			m.pay(m.costs.StreamCreate)
		},
		"SetStreamBusy": func(t *rapid.T) {
			s := m.stream(t)
			busy := rapid.Bool().Draw(t, "busy")
			i, st := m.streamCall(t, s, m.d.SetStreamBusy(s, busy))
			if st == nil {
				return
			}
			st.busy = busy
			if !busy {
				m.run(i, st.queued)
			}
		},
		"CompleteStream": func(t *rapid.T) {
			s := m.stream(t)
			if i, st := m.streamCall(t, s, m.d.CompleteStream(s)); st != nil {
				m.run(i, st.queued)
			}
		},
		"SynchronizeStream": func(t *rapid.T) {
			s := m.stream(t)
			err := m.d.SynchronizeStream(s)
			m.pay(m.costs.StreamSynchronize)
			if i, st := m.streamCall(t, s, err); st != nil {
				m.run(i, st.queued)
				m.c.StreamSynchronizations++
			}
		},
		"Synchronize": func(t *rapid.T) {
			pending := 0
			for _, st := range m.streams {
				if st.completed < st.queued {
					pending++
				}
			}
			before := m.d.Counters().StreamVisits
			require.NoError(t, m.d.Synchronize())
			// The streams it visits are not the model's to say, but they
			// include every stream with work pending and no stream twice.
			visits := m.d.Counters().StreamVisits - before
			require.GreaterOrEqual(t, visits, int64(pending), "a stream with work pending is visited")
			require.LessOrEqual(t, visits, int64(len(m.streams)), "no stream is visited twice")
			m.c.StreamVisits += visits
			for i := range m.streams {
				m.streams[i].completed = m.streams[i].queued
				m.streams[i].waits = nil
			}
			m.c.Synchronizations++
			m.pay(m.costs.Synchronize)
		},
		"RecordEvent": func(t *rapid.T) {
			s := m.stream(t)
			e, err := m.d.RecordEvent(s)
			m.pay(m.costs.EventRecord)
			i, st := m.modelStream(s)
			if st == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				require.Zero(t, e)
				return
			}
			require.NoError(t, err)
			m.nextEvent++
			require.Equal(t, m.nextEvent, e, "events are numbered in order")
			st.queued++
			m.settle()
			m.events[e] = modelEvent{stream: i, seq: st.queued}
			m.c.EventsRecorded++
		},
		"EventDone": func(t *rapid.T) {
			e := m.event(t)
			done, err := m.d.EventDone(e)
			m.pay(m.costs.EventQuery)
			if ev, ok := m.eventQuery(t, e, err); ok {
				m.c.EventQueries++
				require.Equal(t, m.streams[ev.stream].completed >= ev.seq, done)
				return
			}
			require.False(t, done)
		},
		"SynchronizeEvent": func(t *rapid.T) {
			e := m.event(t)
			err := m.d.SynchronizeEvent(e)
			m.pay(m.costs.EventSynchronize)
			if ev, ok := m.eventQuery(t, e, err); ok {
				m.run(ev.stream, ev.seq)
				m.c.EventSynchronizations++
			}
		},
		"WaitEvent": func(t *rapid.T) {
			s := m.stream(t)
			e := m.event(t)
			err := m.d.WaitEvent(s, e)
			m.pay(m.costs.EventWait)
			i, st := m.modelStream(s)
			ev, ok := m.events[e]
			switch {
			case st == nil:
				require.ErrorIs(t, err, device.ErrInvalidStream)
			case !ok:
				require.ErrorIs(t, err, device.ErrInvalidEvent)
			default:
				require.NoError(t, err)
				m.c.EventWaits++
				if ev.stream != i && m.streams[ev.stream].completed < ev.seq {
					st.waits = append(st.waits, modelWait{pos: st.queued, seq: ev.seq, dep: ev.stream})
				}
			}
		},
		"WaitStream": func(t *rapid.T) {
			s, u := m.stream(t), m.stream(t)
			err := m.d.WaitStream(s, u)
			m.pay(m.costs.EventRecord + m.costs.EventWait)
			i, st := m.modelStream(s)
			j, su := m.modelStream(u)
			if st == nil || su == nil {
				require.ErrorIs(t, err, device.ErrInvalidStream)
				return
			}
			require.NoError(t, err)
			m.c.StreamWaits++
			if i == j {
				return // waiting on itself queues and holds nothing
			}
			su.queued++ // the record on u, as RecordEvent's
			m.settle()
			if su.completed < su.queued {
				st.waits = append(st.waits, modelWait{pos: st.queued, seq: su.queued, dep: j})
			}
		},
		"ReleaseEvent": func(t *rapid.T) {
			e := m.event(t)
			err := m.d.ReleaseEvent(e)
			m.pay(m.costs.EventRelease)
			if _, ok := m.events[e]; !ok {
				require.ErrorIs(t, err, device.ErrInvalidEvent)
				return
			}
			require.NoError(t, err)
			delete(m.events, e)
			m.gone = append(m.gone, e)
			m.c.EventsReleased++
		},
		"FailNthMalloc": func(t *rapid.T) {
			n := rapid.IntRange(-1, 4).Draw(t, "n")
			m.d.FailNthMalloc(n)
			m.countdown = max(n, 0)
		},
		"FailMallocAbove": func(t *rapid.T) {
			size := rapid.SampledFrom([]uint64{0, 0, m.page, 2*m.page + 1, m.capacity / 2}).Draw(t, "above")
			m.d.FailMallocAbove(size)
			m.above = size
		},
		"FailMallocWhen": func(t *rapid.T) {
			k := rapid.SampledFrom([]uint64{0, 0, 3, m.page, 2 * m.page}).Draw(t, "multiple")
			if k == 0 {
				m.d.FailMallocWhen(nil)
			} else {
				m.d.FailMallocWhen(func(size uint64) bool { return size%k == 0 })
			}
			m.when = k
		},
		"FailFrees": func(t *rapid.T) {
			m.failFrees = rapid.Bool().Draw(t, "fail frees")
			m.d.FailFrees(faultIf(m.failFrees))
		},
		"FailEventQueries": func(t *rapid.T) {
			m.failEvents = rapid.Bool().Draw(t, "fail event queries")
			m.d.FailEventQueries(faultIf(m.failEvents))
		},
		"": m.check,
	}
}
