package task

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// inbox serves one core NATS subject for the Task: messages arrive on a
// channel subscription and one goroutine, owned by the inbox, hands each
// to serve in arrival order. No NATS callback goroutine ever calls into
// the Task or waits on a request.
//
// Concurrency: the Task's Run goroutine opens, unsubscribes and closes it;
// serve runs only on the inbox's goroutine. close joins that goroutine;
// messages still buffered then are dropped (their requesters time out).
type inbox struct {
	sub     *nats.Subscription
	stop    chan struct{}
	serving sync.WaitGroup
}

// openInbox subscribes to subject with a buffer of size messages and
// starts serving.
func openInbox(nc *nats.Conn, subject string, size int, serve func(*nats.Msg)) (*inbox, error) {
	ch := make(chan *nats.Msg, size)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		return nil, err
	}
	in := &inbox{sub: sub, stop: make(chan struct{})}
	in.serving.Add(1)
	go func() {
		defer in.serving.Done()
		for {
			select {
			case m := <-ch:
				serve(m)
			case <-in.stop:
				return
			}
		}
	}()
	return in, nil
}

// unsubscribe stops intake: a requester finds no responder from now on.
func (in *inbox) unsubscribe() { _ = in.sub.Unsubscribe() }

// close stops serving, waits for the goroutine and unsubscribes.
func (in *inbox) close() {
	close(in.stop)
	in.serving.Wait()
	in.unsubscribe()
}
