// pubsub-fake serves Google's own Pub/Sub fake server, pstest (cloud.google.com/go/pubsub/v2/pstest),
// over gRPC on one address, for pg_cdc's end-to-end tests (scripts/pubsub.sh starts it). pstest keeps
// topics, subscriptions and messages in memory, honours ordering keys on subscriptions with message
// ordering enabled, and accepts any project and no credentials.
//
// Fault injection, for the tests: a Publish request to a topic whose name contains "flaky" fails
// with UNAVAILABLE, nothing of it stored, when it is the 3rd, 6th, 9th, ... such request; each one
// is logged ("injected UNAVAILABLE into Publish to <topic>").
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flaky fails every third Publish request to a "flaky" topic.
type flaky struct{ n atomic.Int64 }

func (f *flaky) React(req interface{}) (bool, interface{}, error) {
	r, ok := req.(*pubsubpb.PublishRequest)
	if !ok || !strings.Contains(r.GetTopic(), "flaky") {
		return false, nil, nil
	}
	if f.n.Add(1)%3 != 0 {
		return false, nil, nil
	}
	log.Printf("injected UNAVAILABLE into Publish to %s", r.GetTopic())
	return true, nil, status.Error(codes.Unavailable, "injected by pubsub-fake")
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8085", "address to serve gRPC on")
	flag.Parse()
	srv := pstest.NewServerWithAddress(*addr, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &flaky{}})
	log.Printf("pstest serving on %s", srv.Addr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("stopping")
	srv.Close()
}
