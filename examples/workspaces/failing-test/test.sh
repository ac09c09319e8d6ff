# test.sh: run with `sh test.sh`; exits non-zero when a test fails.
. ./calc.sh
got=$(add 2 3)
if [ "$got" != 5 ]; then
  echo "FAIL: add 2 3 = $got, expected 5"
  exit 1
fi
got=$(add 10 -4)
if [ "$got" != 6 ]; then
  echo "FAIL: add 10 -4 = $got, expected 6"
  exit 1
fi
echo "ok: 2 tests passed"
