# OpenRLHF's official Llama-3-8B reward model: examples/scripts/train_rm_llama.sh @v0.9.0 06ab51e (conf/recipe/
# openrlhf_rm_llama3_8b.yaml), its flags as ../shared/reference/openrlhf.md §1a records them (the script itself is not
# stored here); v0.9.0's flag names (--attn_implementation from v0.8.10). tests/fidelity/openrlhf_rm.py passes the
# flags to openrlhf.cli.train_rm's own parser, every other value its default.
deepspeed --module openrlhf.cli.train_rm \
   --save_path ./checkpoint/llama3-8b-rm \
   --save_steps -1 \
   --logging_steps 1 \
   --eval_steps -1 \
   --train_batch_size 256 \
   --micro_train_batch_size 1 \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --bf16 \
   --max_epochs 1 \
   --max_len 8192 \
   --zero_stage 3 \
   --learning_rate 9e-6 \
   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \
   --apply_chat_template \
   --chosen_key chosen \
   --rejected_key rejected \
   --attn_implementation flash_attention_2 \
   --packing_samples \
   --load_checkpoint \
   --gradient_checkpointing
