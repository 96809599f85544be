package redisync

import (
	"context"
	"errors"
	"iter"
	"reflect"
	"testing"
	"time"
)

// TestZeroValuesFailEveryCall: a primitive's zero value (made without its
// constructor) fails every call with ErrInvalid, and panics in none. Every
// exported method is called, found by reflection, so that a method added
// later is covered too.
func TestZeroValuesFailEveryCall(t *testing.T) {
	ctxType := reflect.TypeFor[context.Context]()
	errType := reflect.TypeFor[error]()
	for _, v := range []any{&Mutex{}, &RWMutex{}, &Semaphore{}, &MultiMutex{}, &Election{}, &RedMutex{}} {
		val := reflect.ValueOf(v)
		typ := val.Type()
		for i := range typ.NumMethod() {
			method := typ.Method(i)
			t.Run(typ.Elem().Name()+"."+method.Name, func(t *testing.T) {
				ran := false
				var args []reflect.Value
				for j := 1; j < method.Type.NumIn(); j++ {
					in := method.Type.In(j)
					switch {
					case in == ctxType:
						args = append(args, reflect.ValueOf(context.Background()))
					case in.Kind() == reflect.Func:
						fn := reflect.MakeFunc(in, func([]reflect.Value) []reflect.Value {
							ran = true
							return []reflect.Value{reflect.Zero(errType)}
						})
						args = append(args, fn)
					case in == reflect.TypeFor[time.Duration]():
						args = append(args, reflect.ValueOf(time.Second))
					case in.Kind() == reflect.Int64:
						args = append(args, reflect.ValueOf(int64(1)))
					case in.Kind() == reflect.String:
						args = append(args, reflect.ValueOf("v"))
					default:
						t.Fatalf("no argument for a %v", in)
					}
				}
				out := method.Func.Call(append([]reflect.Value{val}, args...))
				if ran {
					t.Error("ran the function given to it")
				}
				for _, r := range out {
					switch {
					case r.Type() == errType:
						if err, _ := r.Interface().(error); !errors.Is(err, ErrInvalid) {
							t.Errorf("error %v, want ErrInvalid", err)
						}
					case r.Type() == reflect.TypeFor[<-chan struct{}]():
						select {
						case <-r.Interface().(<-chan struct{}):
						default:
							t.Error("Lost is not closed")
						}
					case r.Type() == ctxType:
						if r.Interface().(context.Context).Err() == nil {
							t.Error("the hold's context is not cancelled")
						}
					case r.Type() == reflect.TypeFor[iter.Seq2[Leadership, error]]():
						var errs []error
						for _, err := range r.Interface().(iter.Seq2[Leadership, error]) {
							errs = append(errs, err)
						}
						if len(errs) != 1 || !errors.Is(errs[0], ErrInvalid) {
							t.Errorf("the sequence yielded %v, want one ErrInvalid", errs)
						}
					case r.Kind() == reflect.Func:
						r.Call(nil) // a CancelFunc
					case r.Kind() == reflect.Bool:
						if r.Bool() {
							t.Error("reported true")
						}
					}
				}
			})
		}
	}
}
