package main

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/leasestore/leasestore/leasing"
)

// runPause is "leasectl pause": pauses a queue's claims, or some topics'
// (message types' on the inbox), in the database (an operator's right:
// db/roles.sql), then prints the pauses in place.
func runPause(ctx context.Context, c *cli, args []string) error {
	return pauseOrResume(ctx, c, "pause", args)
}

// runResume is "leasectl resume": removes pauses; processors claim at once.
func runResume(ctx context.Context, c *cli, args []string) error {
	return pauseOrResume(ctx, c, "resume", args)
}

func pauseOrResume(ctx context.Context, c *cli, name string, args []string) error {
	fs := c.newFlagSet(name, "--queue inbox|outbox (--topic T ... | --all) [--by WHO] [--json]\n\n"+
		"A topic is the outbox's topic, the inbox's message type. Processors stop claiming\n"+
		"what is paused with their next claim; leases already held run to their end.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	var topics []string
	fs.Func("topic", "`TOPIC` (outbox) or message type (inbox); repeat for more", func(s string) error {
		topics = append(topics, s)
		return nil
	})
	all := fs.Bool("all", false, "the whole queue (its pause is apart from its topics' pauses)")
	by := fs.String("by", defaultPauser(), "who pauses, shown by stats and doctor")
	asJSON := fs.Bool("json", false, `print the pauses in place: [{"queue", "topic", "by", "at"}]`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	switch {
	case *all && len(topics) > 0:
		return usagef("--topic and --all are mutually exclusive")
	case !*all && len(topics) == 0:
		return usagef("name what to %s: --topic T (repeat for more) or --all", name)
	}
	r := leasing.PauseRequest{WholeQueue: *all, Topics: topics, By: *by}
	if err := r.Validate(name == "resume"); err != nil {
		return err
	}
	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	if name == "pause" {
		err = store.Pause(ctx, r)
	} else {
		err = store.Resume(ctx, r)
	}
	if err != nil {
		return c.storeError(err)
	}
	paused, err := store.Paused(ctx)
	if err != nil {
		return c.storeError(err)
	}
	return printPauses(c, q, paused, *asJSON)
}

// printPauses prints a queue's pauses in place, as text or JSON.
func printPauses(c *cli, q leasing.Queue, paused []leasing.Pause, asJSON bool) error {
	if asJSON {
		type pause struct {
			Queue string `json:"queue"`
			Topic string `json:"topic"`
			By    string `json:"by"`
			At    string `json:"at"`
		}
		out := []pause{}
		for _, p := range paused {
			out = append(out, pause{string(p.Queue), p.Topic, p.By, p.At.Format("2006-01-02T15:04:05.999999Z07:00")})
		}
		return writeJSON(c.stdout, out)
	}
	if len(paused) == 0 {
		_, err := fmt.Fprintf(c.stdout, "%s: nothing paused\n", q)
		return err
	}
	for _, p := range paused {
		what := "topic " + p.Topic
		if p.Topic == "" {
			what = "whole queue"
		}
		if _, err := fmt.Fprintf(c.stdout, "%s: %s paused by %s at %s\n", q, what, p.By, p.At.Format("2006-01-02 15:04:05Z07:00")); err != nil {
			return err
		}
	}
	return nil
}

// defaultPauser names the caller as user@host, "leasectl" when neither
// is known.
func defaultPauser() string {
	name := "leasectl"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + strings.SplitN(h, ".", 2)[0]
	}
	return name
}
